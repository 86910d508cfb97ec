"""Log-probabilities of the tokens of long sequences, in one pass with bounded memory.

A linear RNN carries everything it knows about the prefix in its state, so a sequence of any length can be run in
pieces: each piece starts from the state the one before it left (``model(ids, state, return_state=True)``), which
gives the same log-probabilities as one forward over the whole sequence. Only a piece's logits
(``[rows, piece, vocab]``) are in memory at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linrnn.models import LanguageModel

PIECE_TOKENS = 4096  # rows × positions per forward: 4096 × a 32k vocabulary in fp32 is 0.5 GB of logits


@torch.no_grad()
def target_log_probs(model: LanguageModel, tokens: Tensor, piece_tokens: int = PIECE_TOKENS) -> tuple[Tensor, Tensor]:
    """``log p(tokens[:, t + 1] | tokens[:, :t + 1])`` for every t, ``[B, T − 1]`` float32, and whether that token
    is the most likely one there, ``[B, T − 1]`` bool. ``tokens`` is ``[B, T]`` on the model's device; the
    forward runs ``max(1, piece_tokens // B)`` positions at a time with the carried state."""
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    piece = max(1, piece_tokens // tokens.shape[0])
    log_probs, greedy, state = [], [], None
    for start in range(0, inputs.shape[1], piece):
        hidden, state = model.hidden_states(inputs[:, start : start + piece], state, return_state=True)
        logits = model.readout(hidden).float()  # [B, piece, vocab]
        target = targets[:, start : start + piece, None]
        log_probs.append((logits.gather(-1, target) - logits.logsumexp(-1, keepdim=True))[..., 0])
        greedy.append(logits.argmax(-1) == target[..., 0])
    if not log_probs:  # a single token: nothing to predict
        empty = tokens.new_zeros(tokens.shape[0], 0)
        return empty.float(), empty.bool()
    return torch.cat(log_probs, dim=1), torch.cat(greedy, dim=1)
