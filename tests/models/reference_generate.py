"""The token-by-token loop that was ``linrnn.generate`` before it ran through ``linrnn.Engine``, kept as a reference
for the tests (tests/models/test_generate.py): prefill, then one ``model(token, state)`` call per new token with the
carried state; greedy at temperature 0, else ``torch.multinomial`` on softmax(logits / temperature) among the top_k.
No stop tokens: every row gets ``max_new_tokens`` new tokens."""

import torch
from torch import Tensor


@torch.no_grad()
def reference_generate(
    model,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Prompt and new tokens, ``[B, T + max_new_tokens]`` (or ``[T + max_new_tokens]`` for a ``[T]`` prompt)."""
    squeeze = prompt_ids.dim() == 1
    tokens = prompt_ids[None] if squeeze else prompt_ids
    was_training = model.training
    model.eval()
    logits, state = model(tokens, return_state=True)
    for step in range(max_new_tokens):
        next_logits = logits[:, -1].float()
        if temperature == 0:
            next_token = next_logits.argmax(-1, keepdim=True)
        else:
            next_logits = next_logits / temperature
            if top_k is not None:
                threshold = next_logits.topk(min(top_k, next_logits.shape[-1]), dim=-1).values[:, -1:]
                next_logits = next_logits.masked_fill(next_logits < threshold, float("-inf"))
            next_token = torch.multinomial(next_logits.softmax(-1), 1, generator=generator)
        tokens = torch.cat([tokens, next_token], dim=1)
        if step + 1 < max_new_tokens:
            logits, state = model(next_token, state=state, return_state=True)
    model.train(was_training)
    return tokens[0] if squeeze else tokens


def next_token_probabilities(model, prompt: Tensor, temperature: float, top_k: int | None = None) -> Tensor:
    """The reference loop's distribution of the first new token after ``prompt`` ``[T]``: ``[vocab]``."""
    with torch.no_grad():
        logits = model(prompt[None])[0, -1].float() / temperature
    if top_k is not None:
        logits = logits.masked_fill(logits < logits.topk(top_k).values[-1], float("-inf"))
    return logits.softmax(-1)
