"""Causal depthwise short convolution with SiLU, forward and backward, in Triton.

For channel c and token t (``W`` taps, weight ``w [C, W]``)::

    pre[t, c] = Σ_j w[c, j] · x[t − (W − 1 − j), c]      y = SiLU(pre)

Tap j reaches back ``lag = W − 1 − j`` tokens. A tap that reaches before the token's sequence start reads the
carried history ``[B, C, W − 1]`` (oldest first) if there is one, else 0; with packed documents (``offset [T]``,
each token's index within its document, B = 1) a tap reaching before the document start reads 0.

The tensors stay in the projections' ``[B, T, C]`` layout (x may be a column slice of a wider matrix: any row
stride, unit column stride), so no transposed copies are made. The backward is one launch that recomputes ``pre``
from x rather than saving it: ``dpre = dy · SiLU'(pre)`` at the W row blocks shifted by 0 … W − 1 tokens (W times
the arithmetic, no fp32 ``dpre`` in memory), ``dx[t] = Σ_lag w[W − 1 − lag] · dpre[t + lag]``, and ``dw`` as
per-program partial sums ``[programs, C, W]`` that are then reduced.
The history's gradient (decoding only) is left to the caller.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import new_output

BLOCK_T, BLOCK_C = 32, 128


@triton.jit
def _conv_pre(x, history, offset, weight, b, t, c, T, C, stride_b, stride_t, W: tl.constexpr, BT: tl.constexpr,
              BC: tl.constexpr, HAS_HISTORY: tl.constexpr, IS_VARLEN: tl.constexpr):  # fmt: skip
    """``pre`` ``[BT, BC]`` (fp32) at rows ``t`` and channels ``c`` of sequence b; rows outside ``[0, T)`` give 0."""
    t_in, c_in = (t >= 0) & (t < T), c < C
    if IS_VARLEN:
        position = tl.load(offset + t, mask=t_in, other=0)
    else:
        position = t
    pre = tl.zeros([BT, BC], dtype=tl.float32)
    for j in tl.static_range(W):
        tap = tl.load(weight + c * W + j, mask=c_in, other=0).to(tl.float32)
        value = _tap_input(x, history, b, t, c, t_in, c_in, position, C, stride_b, stride_t, W - 1 - j, W, HAS_HISTORY)
        pre += tap[None, :] * value
    return pre


@triton.jit
def _tap_input(x, history, b, t, c, t_in, c_in, position, C, stride_b, stride_t, lag, W: tl.constexpr,
               HAS_HISTORY: tl.constexpr):  # fmt: skip
    """``x[t − lag]`` (fp32) at rows t and channels c: from the history before the sequence start, 0 before the
    token's document start (``position`` < lag) or outside ``t_in``/``c_in``."""
    source = t - lag
    inside = t_in & (lag <= position)
    rows = b.to(tl.int64) * stride_b + source.to(tl.int64) * stride_t
    value = tl.load(x + rows[:, None] + c[None, :], mask=inside[:, None] & c_in[None, :], other=0).to(tl.float32)
    if HAS_HISTORY:  # taps before the sequence start read the history [B, C, W − 1]
        before = t_in & (source < 0)
        spot = (b * C + c[None, :]).to(tl.int64) * (W - 1) + (W - 1 + source)[:, None]
        value += tl.load(history + spot, mask=before[:, None] & c_in[None, :], other=0).to(tl.float32)
    return value


@triton.jit
def _short_conv_fwd_kernel(x, weight, history, offset, y, T, C, stride_b, stride_t,
                           W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_HISTORY: tl.constexpr,
                           IS_VARLEN: tl.constexpr):  # fmt: skip
    block_t, block_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = block_t * BT + tl.arange(0, BT)
    c = block_c * BC + tl.arange(0, BC)
    pre = _conv_pre(x, history, offset, weight, b, t, c, T, C, stride_b, stride_t, W, BT, BC, HAS_HISTORY, IS_VARLEN)
    out = pre * tl.sigmoid(pre)
    spot = (b.to(tl.int64) * T + t.to(tl.int64))[:, None] * C + c[None, :]
    tl.store(y + spot, out.to(y.dtype.element_ty), mask=(t < T)[:, None] & (c < C)[None, :])


@triton.jit
def _grad_pre(x, history, offset, weight, dy, b, t, c, T, C, stride_b, stride_t, W: tl.constexpr, BT: tl.constexpr,
              BC: tl.constexpr, HAS_HISTORY: tl.constexpr, IS_VARLEN: tl.constexpr):  # fmt: skip
    """``d_pre = dy · SiLU'(pre)`` ``[BT, BC]`` (fp32) at rows ``t`` (pre recomputed from x); 0 outside ``[0, T)``."""
    pre = _conv_pre(x, history, offset, weight, b, t, c, T, C, stride_b, stride_t, W, BT, BC, HAS_HISTORY, IS_VARLEN)
    rows_in = (t >= 0) & (t < T)
    dense = (b.to(tl.int64) * T + t.to(tl.int64))[:, None] * C + c[None, :]
    grad_out = tl.load(dy + dense, mask=rows_in[:, None] & (c < C)[None, :], other=0).to(tl.float32)
    gate = tl.sigmoid(pre)
    return grad_out * gate * (1 + pre * (1 - gate))


@triton.jit
def _short_conv_bwd_kernel(x, weight, history, offset, dy, dx, dw_partial, T, C, stride_b, stride_t,
                           W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_HISTORY: tl.constexpr,
                           IS_VARLEN: tl.constexpr):  # fmt: skip
    """``dx[t] = Σ_lag w[W − 1 − lag] · d_pre[t + lag]`` over the taps of token t + lag that reach back to t, with
    ``d_pre`` recomputed at each of the W shifted row blocks (from x and dy, so no fp32 ``d_pre`` goes through
    memory), and this program's share of ``dw`` from ``d_pre`` at its own rows."""
    block_t, block_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = block_t * BT + tl.arange(0, BT)
    c = block_c * BC + tl.arange(0, BC)
    t_in, c_in = t < T, c < C
    grad_x = tl.zeros([BT, BC], dtype=tl.float32)
    for lag in tl.static_range(W):
        rows = t + lag
        grad_pre = _grad_pre(x, history, offset, weight, dy, b, rows, c, T, C, stride_b, stride_t, W, BT, BC,
                             HAS_HISTORY, IS_VARLEN)  # fmt: skip
        if lag == 0:  # dw[c, j] = Σ_t d_pre[t, c] · x[t − (W − 1 − j), c], this program's rows
            if IS_VARLEN:
                position = tl.load(offset + t, mask=t_in, other=0)
            else:
                position = t
            partial = dw_partial + ((b * tl.num_programs(0) + block_t) * C + c).to(tl.int64) * W
            for j in tl.static_range(W):
                value = _tap_input(x, history, b, t, c, t_in, c_in, position, C, stride_b, stride_t, W - 1 - j, W,
                                   HAS_HISTORY)  # fmt: skip
                tl.store(partial + j, tl.sum(grad_pre * value, axis=0), mask=c_in)
        elif IS_VARLEN:  # token t + lag's tap reaches back to t only inside its document
            reaches = lag <= tl.load(offset + rows, mask=rows < T, other=0)
            grad_pre = tl.where(reaches[:, None], grad_pre, 0.0)
        tap = tl.load(weight + c * W + (W - 1 - lag), mask=c_in, other=0).to(tl.float32)
        grad_x += grad_pre * tap[None, :]
    spot = (b.to(tl.int64) * T + t.to(tl.int64))[:, None] * C + c[None, :]
    tl.store(dx + spot, grad_x.to(dx.dtype.element_ty), mask=t_in[:, None] & c_in[None, :])


@triton.jit
def _short_conv_step_kernel(x, weight, history, y, C, stride_b, W: tl.constexpr, BW: tl.constexpr,
                            BC: tl.constexpr):  # fmt: skip
    """One decoding token: ``y = SiLU(Σ_j w[j] · [history, x][j])`` and the history shifted by one, in place. Only
    this program touches its channels' history; the barrier orders every thread's reads before any thread's writes
    (a slot is read by one thread and may be written by another)."""
    block_c, b = tl.program_id(0), tl.program_id(1)
    c = block_c * BC + tl.arange(0, BC)
    c_in = c < C
    j = tl.arange(0, BW)  # history slots, oldest first; W − 1 of them are real
    j_in = j < W - 1
    spot = (b.to(tl.int64) * C + c[:, None]) * (W - 1) + j[None, :]
    past = tl.load(history + spot, mask=c_in[:, None] & j_in[None, :], other=0)  # [BC, BW]
    taps = tl.load(weight + c[:, None] * W + j[None, :], mask=c_in[:, None] & j_in[None, :], other=0)
    token = tl.load(x + b.to(tl.int64) * stride_b + c, mask=c_in, other=0)
    last_tap = tl.load(weight + c * W + (W - 1), mask=c_in, other=0).to(tl.float32)
    pre = tl.sum(taps.to(tl.float32) * past.to(tl.float32), axis=1) + last_tap * token.to(tl.float32)
    tl.store(y + b.to(tl.int64) * C + c, (pre * tl.sigmoid(pre)).to(y.dtype.element_ty), mask=c_in)
    tl.debug_barrier()
    tl.store(history + spot - 1, past, mask=c_in[:, None] & j_in[None, :] & (j[None, :] > 0))  # slot j → j − 1
    tl.store(history + (b.to(tl.int64) * C + c) * (W - 1) + (W - 2), token.to(history.dtype.element_ty), mask=c_in)


def short_conv_step(x: Tensor, weight: Tensor, history: Tensor) -> Tensor:
    """One token per row: x ``[B, 1, C]`` (unit column stride), weight ``[C, W]`` contiguous (W ≥ 2), history
    ``[B, C, W − 1]`` contiguous, x's dtype, updated in place → SiLU(conv) ``[B, 1, C]``."""
    batch, _, channels = x.shape
    width = weight.shape[1]
    y = new_output((batch, 1, channels), x.dtype, x.device)
    _short_conv_step_kernel[(triton.cdiv(channels, BLOCK_C), batch)](
        x, weight, history, y, channels, x.stride(0), W=width, BW=triton.next_power_of_2(width - 1), BC=BLOCK_C
    )
    return y


def _launch_shape(x: Tensor) -> tuple[int, int, int]:
    return triton.cdiv(x.shape[1], BLOCK_T), triton.cdiv(x.shape[2], BLOCK_C), x.shape[0]


def short_conv_forward(x: Tensor, weight: Tensor, history: Tensor | None, offset: Tensor | None) -> Tensor:
    """x ``[B, T, C]`` (unit column stride), weight ``[C, W]`` contiguous, history ``[B, C, W − 1]`` contiguous
    or None, offset ``[T]`` (B = 1) or None → SiLU(conv) ``[B, T, C]`` contiguous, x's dtype."""
    batch, steps, channels = x.shape
    y = new_output((batch, steps, channels), x.dtype, x.device)
    grid = _launch_shape(x)
    reads_history = history is not None and offset is None  # packed documents all start from zeros
    _short_conv_fwd_kernel[grid](x, weight, history, offset, y, steps, channels, x.stride(0), x.stride(1),
                                 W=weight.shape[1], BT=BLOCK_T, BC=BLOCK_C, HAS_HISTORY=reads_history,
                                 IS_VARLEN=offset is not None)  # fmt: skip
    return y


def short_conv_backward(dy: Tensor, x: Tensor, weight: Tensor, history: Tensor | None,
                        offset: Tensor | None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``dy`` ``[B, T, C]`` contiguous → (dx ``[B, T, C]`` in x's dtype, dw ``[C, W]`` fp32). The history's
    gradient is not formed here."""
    batch, steps, channels = x.shape
    grid = _launch_shape(x)
    dx = new_output((batch, steps, channels), x.dtype, x.device)
    dw_partial = new_output((batch * grid[0], channels, weight.shape[1]), torch.float32, x.device)
    reads_history = history is not None and offset is None  # packed documents all start from zeros
    _short_conv_bwd_kernel[grid](x, weight, history, offset, dy, dx, dw_partial, steps, channels, x.stride(0),
                                 x.stride(1), W=weight.shape[1], BT=BLOCK_T, BC=BLOCK_C, HAS_HISTORY=reads_history,
                                 IS_VARLEN=offset is not None)  # fmt: skip
    return dx, dw_partial.sum(0)
