"""Softmax cross-entropy over the rows of one chunk of logits, and its gradient written in place, in Triton.

For row i with logits ``z = multiplier · x_i + bias`` (x_i the GEMM's output row, any float dtype; bias fp32 or
absent) and target ``y_i``::

    lse = log Σ_v exp z_v    loss_i = lse − z_{y_i}    dz = multiplier · (softmax(z) − onehot(y_i))

in fp32. One program per row: a first sweep over the vocabulary keeps a running maximum and sum of exponentials,
a second (only with the gradient) overwrites the row with ``dz`` in its own dtype. A row whose target is
``ignore_index`` has loss 0 and gradient 0. This replaces the unfused chain (fp32 copy, scale, logsumexp, gather,
exp, one-hot subtraction, mask, cast): two reads and one write of the row instead of about eight passes.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import new_output, next_power_of_2

BLOCK_V = 4096


@triton.jit
def _logits_block(base, bias, cols, V, multiplier, HAS_BIAS: tl.constexpr):
    """``multiplier · x + bias`` (fp32) at columns ``cols`` of the row at ``base``; -inf past V."""
    inside = cols < V
    z = tl.load(base + cols, mask=inside, other=0).to(tl.float32) * multiplier
    if HAS_BIAS:
        z += tl.load(bias + cols, mask=inside, other=0).to(tl.float32)
    return tl.where(inside, z, float("-inf"))


@triton.jit
def _cross_entropy_rows_kernel(logits, bias, targets, loss, V, row_stride, multiplier, ignore_index,
                               HAS_BIAS: tl.constexpr, WITH_GRAD: tl.constexpr, BV: tl.constexpr):  # fmt: skip
    row = tl.program_id(0)
    base = logits + row.to(tl.int64) * row_stride
    target = tl.load(targets + row)
    valid = target != ignore_index
    running_max = tl.full([BV], float("-inf"), dtype=tl.float32)
    running_sum = tl.zeros([BV], dtype=tl.float32)
    picked = tl.zeros([BV], dtype=tl.float32)
    for start in range(0, V, BV):
        cols = start + tl.arange(0, BV)
        z = _logits_block(base, bias, cols, V, multiplier, HAS_BIAS)
        new_max = tl.maximum(running_max, z)
        shift = tl.where(new_max == float("-inf"), 0.0, new_max)  # lanes that saw only -inf: no -inf - -inf (NaN)
        running_sum = running_sum * tl.exp(running_max - shift) + tl.exp(z - shift)
        running_max = new_max
        picked += tl.where(cols == target, z, 0.0)
    row_max = tl.max(running_max, axis=0)
    lse = row_max + tl.log(tl.sum(running_sum * tl.exp(running_max - row_max), axis=0))
    tl.store(loss + row, tl.where(valid, lse - tl.sum(picked, axis=0), 0.0))
    if WITH_GRAD:
        for start in range(0, V, BV):
            cols = start + tl.arange(0, BV)
            z = _logits_block(base, bias, cols, V, multiplier, HAS_BIAS)
            grad = tl.exp(z - lse) - tl.where(cols == target, 1.0, 0.0)  # exp(-inf) = 0 past V
            grad = tl.where(valid, grad * multiplier, 0.0)
            tl.store(base + cols, grad.to(base.dtype.element_ty), mask=cols < V)


def cross_entropy_rows(logits: Tensor, targets: Tensor, bias: Tensor | None, multiplier: float, ignore_index: int,
                       with_grad: bool) -> Tensor:  # fmt: skip
    """logits ``[c, V]`` (unit column stride; overwritten by ``dz`` when ``with_grad``), targets ``[c]`` int64,
    bias ``[V]`` or None → per-row loss ``[c]`` fp32 (0 where the target is ``ignore_index``)."""
    rows, vocab = logits.shape
    loss = new_output((rows,), torch.float32, logits.device)
    _cross_entropy_rows_kernel[(rows,)](logits, bias, targets, loss, vocab, logits.stride(0), float(multiplier),
                                        ignore_index, HAS_BIAS=bias is not None, WITH_GRAD=with_grad,
                                        BV=min(BLOCK_V, next_power_of_2(vocab)))  # fmt: skip
    return loss
