"""The end of a greedy decoding step in one launch: each slot's argmax token, written as the step's output and as
the next step's input, and the slot's position and token counter advanced (``linrnn.inference.Engine``).

One program a slot reads its logits row in blocks of ``BLOCK`` (the first maximum wins, as ``torch.argmax``), where
torch's reduction and four one-element copies and adds took ~19 µs a step at batch 1 (``benchmarks/RESULTS.md``).
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import next_power_of_2

BLOCK = 32768  # logits a loop step: 32000 in one
WARPS = 16


@triton.jit
def _greedy_step_kernel(logits, row_stride, vocab, next_tokens, tokens, token_stride, positions, counters,
                        BLOCK: tl.constexpr):  # fmt: skip
    slot = tl.program_id(0)
    row = logits + slot.to(tl.int64) * row_stride
    best = tl.full([], float("-inf"), tl.float32)
    best_at = tl.full([], 0, tl.int64)
    for start in range(0, vocab, BLOCK):
        at = start + tl.arange(0, BLOCK)
        values = tl.load(row + at, mask=at < vocab, other=float("-inf")).to(tl.float32)
        block_best, block_at = tl.max(values, axis=0, return_indices=True, return_indices_tie_break_left=True)
        better = block_best > best  # strictly: an earlier block's maximum wins a tie
        best_at = tl.where(better, start + block_at.to(tl.int64), best_at)
        best = tl.where(better, block_best, best)
    tl.store(next_tokens + slot, best_at)
    tl.store(tokens + slot * token_stride, best_at)
    tl.store(positions + slot, tl.load(positions + slot) + 1)
    tl.store(counters + slot, tl.load(counters + slot) + 1)


def greedy_step(logits: Tensor, next_tokens: Tensor, tokens: Tensor, positions: Tensor, counters: Tensor) -> None:
    """logits ``[S, V]`` (unit column stride) → in place: ``next_tokens[s]`` and ``tokens[s]`` (any stride) = the
    row's argmax, ``positions[s]`` and ``counters[s]`` += 1; all int64 ``[S]``."""
    slots, vocab = logits.shape
    block = min(BLOCK, next_power_of_2(vocab))
    _greedy_step_kernel[(slots,)](logits, logits.stride(0), vocab, next_tokens, tokens, tokens.stride(0), positions,
                                  counters, BLOCK=block, num_warps=WARPS)  # fmt: skip
