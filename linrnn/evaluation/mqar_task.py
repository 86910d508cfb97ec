"""The MQAR task: its examples, the accuracy at the query positions, the models, and one training run.

The layout follows ``zoology.data.multiquery_ar.multiquery_ar`` (HazyResearch/zoology, its defaults
``power_a=0.01``, ``random_non_queries=True``, ``num_passes=1``); the code here is linrnn's own. With T tokens,
P pairs and a vocabulary of V tokens:

- keys are P distinct tokens of ``[1, V/2)``, values P distinct tokens of ``[V/2, V)`` (V/2 rounded down), drawn
  uniformly per example; positions ``0 .. 2P−1`` hold ``k_1 v_1 k_2 v_2 … k_P v_P``;
- the rest, positions ``2P .. T−1``, has ``space = (T − 2P) // 2`` slots at the even offsets ``2P + 2g``
  (g = 0 … space−1). Each key is queried once, in a slot drawn without replacement with probability ∝
  ``(g + 1)^(a − 1)``, a = ``power_a``: nearly ∝ 1/(g + 1), so most queries come soon after the pairs and a few far
  away (the gap between repeated bigrams in text follows a power law). The queries come in random order;
- every other position holds a filler token drawn uniformly from the whole vocabulary ``[0, V)`` (it may equal a
  key or a value: it is noise the model must not store over the pairs);
- labels are −100 (ignored) everywhere but at the query positions, where the label is the queried key's value:
  the model reads the key there and must predict the value as the next token. The value never appears after the
  query in the input (the next position is filler), so the answer can only come from the pairs at the start.

Example (T = 16, P = 2, V = 12; filler shown as ·)::

    position  0  1  2  3  4  5  6  7  8  9  10 11 12 13 14 15
    input     2  8  4  7  ·  ·  4  ·  ·  ·  ·  ·  2  ·  ·  ·
    label     ·  ·  ·  ·  ·  ·  7  ·  ·  ·  ·  ·  8  ·  ·  ·

The accuracy is the fraction of query positions whose argmax over the whole vocabulary is the label. A model that
cannot see the pairs can at best guess one of the V − V/2 values: accuracy ≈ 1/(V − V/2), ``chance_accuracy``.

Sampling: the uniform subsets are the top P of i.i.d. uniform scores, the power-law slots the top P of
``log p_g`` plus Gumbel noise (the Gumbel-top-k trick: the same distribution as drawing P times without replacement
with renormalised probabilities, as numpy's ``choice(replace=False, p=p)`` does in zoology). Everything is drawn
from one ``torch.Generator``: the held-out set on the CPU (the same everywhere), a run's training examples on its
device (the same on every CPU, and on every CUDA device).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

IGNORE_INDEX = -100
TEST_SEED = 0  # the held-out set's generator; a run with seed s trains on the stream of generator 2s + 1
FLA_MODELS = {"fla-gdn": "gated_deltanet", "fla-kda": "kda"}  # FLA's model → linrnn's cell of the same layout
FLA_NOTE = ("FLA 0.6.0 with fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True: its refusal of the gated backward on "
            "Hopper with Triton 3.4 to 3.7.0 (wrong gradients there, FLA issue #640) lifted")  # fmt: skip
CURVE_POINTS = 20  # training-loss samples kept per run


class MQARSettings(BaseModel):
    """Everything a run depends on besides its grid point (cell, width, learning rate, seed): the task, the model
    shape and the training recipe. A results file holds runs of one ``MQARSettings`` only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seq_len: int = Field(16, gt=0, description="T, tokens per example")
    num_pairs: int = Field(2, gt=0, description="P, key–value pairs per example")
    vocab_size: int = Field(16, gt=0, description="V: keys from [1, V/2), values from [V/2, V)")
    power_a: float = Field(0.01, gt=0, le=1, description="query slot g drawn ∝ (g + 1)^(power_a − 1)")
    num_layers: int = Field(2, gt=0)
    num_heads: int = Field(2, gt=0)
    steps: int = Field(100, gt=0)
    batch_size: int = Field(32, gt=0)
    test_examples: int = Field(1000, gt=0)
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.1, ge=0, description="on matrices and embeddings; none on vectors and scalars")
    warmup_fraction: float = Field(0.1, ge=0, lt=1, description="linear warmup, then cosine decay to 0")
    max_norm: float = Field(1.0, gt=0, description="gradient clipping")

    @model_validator(mode="after")
    def _fits(self) -> MQARSettings:
        check_task(self.seq_len, self.num_pairs, self.vocab_size)
        return self

    @property
    def num_values(self) -> int:
        return self.vocab_size - self.vocab_size // 2


def check_task(seq_len: int, num_pairs: int, vocab_size: int) -> None:
    """Raises ValueError unless P pairs and their P queries fit in T tokens, and P distinct keys and values in the
    vocabulary."""
    if 4 * num_pairs > seq_len:
        raise ValueError(f"argument --pairs: expected at most seq-len // 4 = {seq_len // 4} pairs with --seq-len "
                         f"{seq_len} (2P tokens of pairs, then P query slots two tokens apart), "
                         f"got {num_pairs}")  # fmt: skip
    if num_pairs > vocab_size // 2 - 1:
        raise ValueError(f"argument --pairs: expected at most vocab // 2 - 1 = {vocab_size // 2 - 1} pairs with "
                         f"--vocab {vocab_size} (distinct keys in [1, V/2), values in [V/2, V)), "
                         f"got {num_pairs}")  # fmt: skip


def chance_accuracy(vocab_size: int) -> float:
    """The accuracy of guessing a value without the context: 1 / (V − V/2)."""
    return 1 / (vocab_size - vocab_size // 2)


def multiquery_ar(num_examples: int, seq_len: int, num_pairs: int, vocab_size: int, generator: torch.Generator,
                  power_a: float = 0.01) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``num_examples`` MQAR examples (layout in the module docstring): inputs and labels ``[N, T]`` int64, labels
    −100 except at the query positions; on the generator's device."""
    check_task(seq_len, num_pairs, vocab_size)
    n, pairs, half, device = num_examples, num_pairs, vocab_size // 2, generator.device
    draw = lambda *shape: torch.rand(*shape, generator=generator, device=device)  # noqa: E731
    keys = draw(n, half - 1).topk(pairs, dim=1).indices + 1  # [N, P] distinct, in [1, V/2)
    values = draw(n, vocab_size - half).topk(pairs, dim=1).indices + half  # [N, P] distinct, in [V/2, V)
    space = (seq_len - 2 * pairs) // 2
    log_p = (power_a - 1) * torch.arange(1, space + 1, device=device).log()  # [space], unnormalised
    gumbel = -(-draw(n, space).log()).log()
    slots = (log_p + gumbel).topk(pairs, dim=1).indices  # [N, P] distinct, in order of drawing
    positions = 2 * pairs + 2 * slots  # [N, P] where key j is queried

    inputs = torch.randint(0, vocab_size, (n, seq_len), generator=generator, device=device)  # filler
    inputs[:, 0 : 2 * pairs : 2] = keys
    inputs[:, 1 : 2 * pairs : 2] = values
    inputs.scatter_(1, positions, keys)
    labels = torch.full((n, seq_len), IGNORE_INDEX, dtype=torch.long, device=device)
    labels.scatter_(1, positions, values)
    return inputs, labels


def held_out_set(settings: MQARSettings) -> tuple[Tensor, Tensor]:
    """The held-out examples: ``settings.test_examples`` from generator ``TEST_SEED`` (no run trains on them)."""
    generator = torch.Generator().manual_seed(TEST_SEED)
    return multiquery_ar(settings.test_examples, settings.seq_len, settings.num_pairs, settings.vocab_size,
                         generator, settings.power_a)  # fmt: skip


def train_stream(settings: MQARSettings, seed: int, device: torch.device | str = "cpu"
                 ) -> Callable[[], tuple[Tensor, Tensor]]:  # fmt: skip
    """A fresh batch per call, drawn on ``device`` by a generator seeded with ``2 · seed + 1`` (never
    ``TEST_SEED``): the same stream on every CPU, and on every CUDA device (another one than the CPU's)."""
    generator = torch.Generator(device).manual_seed(2 * seed + 1)
    return lambda: multiquery_ar(settings.batch_size, settings.seq_len, settings.num_pairs, settings.vocab_size,
                                 generator, settings.power_a)  # fmt: skip


Predictor = Callable[[Tensor, Tensor], Tensor]  # (inputs [B, T], query positions [B, P]) → logits [B, P, V]


def query_positions(labels: Tensor, num_queries: int) -> Tensor:
    """The positions ``[B, P]`` (in no particular order) of the labels ``[B, T]`` that are not ignored, when every
    row has ``num_queries`` of them: found on the labels' device, without waiting for it."""
    return (labels != IGNORE_INDEX).float().topk(num_queries, dim=1, sorted=False).indices


@torch.no_grad()
def evaluate(predict: Predictor, inputs: Tensor, labels: Tensor, batch_size: int,
             device: torch.device | str = "cpu") -> tuple[float, float]:  # fmt: skip
    """(accuracy, mean cross-entropy) over every query position of ``inputs``/``labels`` ``[N, T]`` (each row with
    the same number of queries): accuracy is the fraction whose argmax logit is the label."""
    num_queries = int((labels[0] != IGNORE_INDEX).sum())
    correct, nats = 0, 0.0
    for start in range(0, len(inputs), batch_size):
        x, y = inputs[start : start + batch_size].to(device), labels[start : start + batch_size].to(device)
        positions = query_positions(y, num_queries)
        logits = predict(x, positions).float().flatten(0, 1)  # [B · P, V]
        answers = y.gather(1, positions).flatten()
        correct += int((logits.argmax(-1) == answers).sum())
        nats += float(F.cross_entropy(logits, answers, reduction="sum"))
    return correct / (len(inputs) * num_queries), nats / (len(inputs) * num_queries)


# ----------------------------------------------------------------------------------------------------------
# models


def fla_available() -> bool:
    try:
        import fla.models  # noqa: F401
    except Exception:  # ImportError, or a broken install failing at import
        return False
    return True


def build(name: str, width: int, settings: MQARSettings) -> nn.Module:
    """The model ``name`` at ``width`` on the CPU: linrnn's generic LM of the cell, or FLA's
    ``GatedDeltaNetForCausalLM`` / ``KDAForCausalLM`` (``fla-gdn``, ``fla-kda``) of the same shape: key width
    0.75 × width and value width 1.5 × width over ``num_heads`` heads, SwiGLU MLP 4 × width, tied embeddings."""
    if name not in FLA_MODELS:
        import linrnn

        return linrnn.build_model(name, preset="byte-tiny", vocab_size=settings.vocab_size, hidden_size=width,
                                  num_layers=settings.num_layers, num_heads=settings.num_heads)  # fmt: skip
    from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, KDAConfig, KDAForCausalLM

    config_class, model_class = {"fla-gdn": (GatedDeltaNetConfig, GatedDeltaNetForCausalLM),
                                 "fla-kda": (KDAConfig, KDAForCausalLM)}[name]  # fmt: skip
    config = config_class(
        vocab_size=settings.vocab_size,
        hidden_size=width,
        num_hidden_layers=settings.num_layers,
        num_heads=settings.num_heads,
        head_dim=3 * width // (4 * settings.num_heads),
        expand_v=2.0,  # value head dim = 2 × key head dim = 1.5 × width / heads
        intermediate_size=4 * width,
        tie_word_embeddings=True,
        fuse_cross_entropy=False,
    )
    return model_class(config)


def query_logits(model: nn.Module, inputs: Tensor, positions: Tensor) -> Tensor:
    """Logits ``[B, P, V]`` at ``positions`` ``[B, P]`` of ``inputs`` ``[B, T]``: the readout runs on those rows
    only (the full ``[B, T, V]`` logits would be large at V = 8192)."""
    from linrnn.models import LanguageModel

    if isinstance(model, LanguageModel):
        hidden, _ = model.hidden_states(inputs)  # [B, T, D]
    else:
        hidden = model.model(input_ids=inputs, use_cache=False)[0]  # FLA: the final norm's output, as its forward
    picked = hidden.gather(1, positions[..., None].expand(-1, -1, hidden.shape[-1]))  # [B, P, D]
    return model.readout(picked) if isinstance(model, LanguageModel) else model.lm_head(picked)


def num_parameters(name: str, width: int, settings: MQARSettings) -> int:
    """Parameters of ``build(name, width, settings)``, tied embeddings counted once. Raises the model's own
    ValueError when width and heads do not fit. (Built on the CPU: on the meta device the initialisation would
    import torch._dynamo, which takes longer than building these small models.)"""
    return sum(p.numel() for p in build(name, width, settings).parameters())


# ----------------------------------------------------------------------------------------------------------
# one run


def lr_factor(step: int, steps: int, warmup_fraction: float) -> float:
    """The learning rate of ``step`` (0-based) over the peak: linear warmup, then cosine decay to 0 at ``steps``."""
    warmup = max(1, round(warmup_fraction * steps))
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def train_run(name: str, width: int, lr: float, seed: int, settings: MQARSettings, device: torch.device,
              test: tuple[Tensor, Tensor]) -> dict[str, Any]:  # fmt: skip
    """Trains model ``name`` at ``width`` for ``settings.steps`` AdamW steps on fresh examples, then scores it on
    ``test``; returns its results row. bf16 autocast on CUDA, fp32 on the CPU."""
    note = None
    if name in FLA_MODELS:
        import fla.ops.common.chunk_o as chunk_o

        chunk_o.TRITON_ABOVE_3_7_1 = True
        note = FLA_NOTE
    torch.manual_seed(seed)
    model = build(name, width, settings).to(device)
    matrices = [p for p in model.parameters() if p.dim() >= 2]
    others = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": matrices, "weight_decay": settings.weight_decay}, {"params": others, "weight_decay": 0.0}],
        lr=lr, betas=settings.betas, fused=device.type == "cuda",
    )  # fmt: skip
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, settings.steps, settings.warmup_fraction)
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    next_batch = train_stream(settings, seed, device)
    predict = lambda x, positions: query_logits(model, x, positions)  # noqa: E731
    losses, diverged, start = [], False, time.perf_counter()
    model.train()
    for step in range(settings.steps):
        inputs, labels = next_batch()
        positions = query_positions(labels, settings.num_pairs)
        with autocast:
            logits = predict(inputs, positions)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.gather(1, positions).flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.max_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if (step + 1) % 50 == 0 and not torch.isfinite(torch.stack(losses[-50:])).all():  # a check reads the device
            diverged = True
            break
    curve = torch.stack(losses).float().cpu()
    diverged = diverged or not bool(torch.isfinite(curve).all())
    train_seconds = time.perf_counter() - start
    model.eval()
    accuracy, test_loss = 0.0, None
    if not diverged:
        with autocast:
            accuracy, test_loss = evaluate(predict, *test, settings.batch_size, device)
    tail = curve[-max(1, len(curve) // 10) :]  # the last tenth of the steps
    every = max(1, settings.steps // CURVE_POINTS)
    return {
        "cell": name,
        "width": width,
        "lr": lr,
        "seed": seed,
        "steps": len(curve),
        "accuracy": accuracy,
        "test_loss": test_loss,
        "train_loss": None if diverged else round(float(tail.mean()), 4),
        "diverged": diverged,
        "loss_curve": [round(x, 4) if math.isfinite(x) else None for x in curve[::every].tolist()],
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(train_seconds, 2),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "note": note,
    }
