"""Causal depthwise short convolution with SiLU, forward and backward, in Triton.

For channel c and token t (``W`` taps, weight ``w [C, W]``)::

    pre[t, c] = Σ_j w[c, j] · x[t − (W − 1 − j), c]      y = SiLU(pre)

Tap j reaches back ``lag = W − 1 − j`` tokens. A tap that reaches before the token's sequence start reads the
carried history ``[B, C, W − 1]`` (oldest first) if there is one, else 0; with packed documents (``offset [T]``,
each token's index within its document, B = 1) a tap reaching before the document start reads 0.

The tensors stay in the projections' ``[B, T, C]`` layout (x may be a column slice of a wider matrix: any row
stride, unit column stride), so no transposed copies are made. The forward works on ``[BLOCK_T, BLOCK_C]`` tiles,
one load of x per tap. The backward recomputes ``pre`` from x rather than saving it: a program walks ``BWD_SPAN``
rows of ``BWD_CHANNELS`` channels one row at a time, with the last W − 1 rows of x and of ``dpre = dy · SiLU'(pre)``
in registers, so every row is read once, ``dx[t] = Σ_lag w[W − 1 − lag] · dpre[t + lag]`` needs no fp32 ``dpre``
in memory, and ``dw`` is summed per channel (per-program partial sums ``[programs, C, W]``, then reduced). (A tiled
backward, W shifted tiles each recomputing ``pre``, issued ~6× the instructions at 12% occupancy: 3.7× the time.)
The history's gradient (decoding only) is left to the caller.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import cdiv, new_output, next_power_of_2

BLOCK_T, BLOCK_C = 32, 128
BWD_SPAN, BWD_CHANNELS, BWD_WARPS = 128, 512, 4  # the backward's rows and channels per program


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
def _piece_columns(p0, p1, p2, p3, e1, e2, e3, c, C):
    """Channels c of the concatenated ``[.., C]`` as columns of up to four contiguous pieces (piece i holds
    channels ``e_i .. e_{i+1}``, ``e_0 = 0``, ``e_4 = C``): each channel's pointer in row 0 of its piece, and that
    piece's width (its row stride)."""
    column = tl.where(c < e1, p0 + c, tl.where(c < e2, p1 + (c - e1), tl.where(c < e3, p2 + (c - e2), p3 + (c - e3))))
    width = tl.where(c < e1, e1, tl.where(c < e2, e2 - e1, tl.where(c < e3, e3 - e2, C - e3)))
    return column, width.to(tl.int64)


@triton.jit
def _short_conv_fwd_kernel(x, weight, history, offset, y0, y1, y2, y3, e1, e2, e3, T, C, stride_b, stride_t,
                           W: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, HAS_HISTORY: tl.constexpr,
                           IS_VARLEN: tl.constexpr):  # fmt: skip
    """``[BT, BC]`` of y, stored into its pieces (``_piece_columns``)."""
    block_t, block_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    t = block_t * BT + tl.arange(0, BT)
    c = block_c * BC + tl.arange(0, BC)
    pre = _conv_pre(x, history, offset, weight, b, t, c, T, C, stride_b, stride_t, W, BT, BC, HAS_HISTORY, IS_VARLEN)
    out = pre * tl.sigmoid(pre)
    column, width = _piece_columns(y0, y1, y2, y3, e1, e2, e3, c, C)
    spot = column[None, :] + (b.to(tl.int64) * T + t.to(tl.int64))[:, None] * width[None, :]
    tl.store(spot, out.to(y0.dtype.element_ty), mask=(t < T)[:, None] & (c < C)[None, :])


@triton.jit
def _short_conv_bwd_kernel(x, weight, history, offset, dy0, dy1, dy2, dy3, e1, e2, e3, dx, dw_partial, T, C, stride_b,
                           stride_t,
                           W: tl.constexpr, BC: tl.constexpr, SPAN: tl.constexpr, HAS_HISTORY: tl.constexpr,
                           IS_VARLEN: tl.constexpr):  # fmt: skip
    """Rows ``[first, last)`` of sequence b (``SPAN`` of them) and channels c, one row per step, with the last W − 1
    rows of x and of ``d_pre`` carried in registers. At step t (from ``first − (W − 1)`` to ``last + W − 2``)::

        pre[t] = Σ_j w[j] · x[t − (W − 1 − j)]        d_pre[t] = dy[t] · SiLU'(pre[t])
        dw[j] += d_pre[t] · x[t − (W − 1 − j)]        (own rows t only)
        dx[r] = Σ_lag w[W − 1 − lag] · d_pre[r + lag]  at r = t − (W − 1)

    With packed documents a tap reaching back ``lag`` tokens counts only if its token's ``offset`` ≥ lag, in pre
    and in dx alike. Every row of x and dy is read once (plus 2(W − 1) rows at the span's edges) and ``dw``'s sums
    stay per channel: no reduction across rows. dy comes in pieces (``_piece_columns``)."""
    block_t, block_c, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    c = block_c * BC + tl.arange(0, BC)
    c_in = c < C
    first = block_t * SPAN
    last = tl.minimum(first + SPAN, T)
    taps = ()
    for j in tl.static_range(W):
        taps = taps + (tl.load(weight + c * W + j, mask=c_in, other=0).to(tl.float32),)
    zeros = tl.zeros([BC], dtype=tl.float32)
    x_window, grad_window, positions, dw = (), (), (), ()  # rows t − (W − 1) … t − 1, oldest first
    for j in tl.static_range(W - 1):
        x_window, grad_window, positions = x_window + (zeros,), grad_window + (zeros,), positions + (first - W + 1 + j,)
    for _ in tl.static_range(W):
        dw = dw + (zeros,)
    start = (first - (W - 1)).to(tl.int64)
    x_row = x + b.to(tl.int64) * stride_b + start * stride_t + c  # pointers of row t, advanced each step
    dy_column, dy_width = _piece_columns(dy0, dy1, dy2, dy3, e1, e2, e3, c, C)
    dy_row = dy_column + (b.to(tl.int64) * T + start) * dy_width
    dx_row = dx + (b.to(tl.int64) * T + start - (W - 1)) * C + c  # row t − (W − 1)
    for t in range(first - (W - 1), last + (W - 1)):
        row_in = (t >= 0) & (t < T)
        columns_in = tl.where(row_in, c_in, False)  # not c_in & row_in: Triton 3.9's interpreter makes that int32
        x_t = tl.load(x_row, mask=columns_in, other=0).to(tl.float32)
        if HAS_HISTORY:  # rows before the sequence start: the history [B, C, W − 1]
            spot = (b * C + c).to(tl.int64) * (W - 1) + (W - 1 + t)
            before = tl.where((t < 0) & (t >= 1 - W), c_in, False)
            x_t += tl.load(history + spot, mask=before, other=0).to(tl.float32)
        if IS_VARLEN:
            position = tl.load(offset + t, mask=row_in, other=0).to(tl.int32)  # the carried positions are int32
        else:
            position = t
        rows = x_window + (x_t,)  # x[t − (W − 1) + i]
        pre = zeros
        for j in tl.static_range(W):
            if IS_VARLEN:
                pre += tl.where(W - 1 - j <= position, taps[j] * rows[j], 0.0)
            else:
                pre += taps[j] * rows[j]
        grad_out = tl.load(dy_row, mask=columns_in, other=0).to(tl.float32)
        gate = tl.sigmoid(pre)
        grad_pre = grad_out * gate * (1 + pre * (1 - gate))
        own = (t >= first) & (t < last)
        sums = ()
        for j in tl.static_range(W):
            reaches = own & (W - 1 - j <= position) if IS_VARLEN else own
            sums = sums + (dw[j] + tl.where(reaches, grad_pre * rows[j], 0.0),)
        dw = sums
        grads = grad_window + (grad_pre,)  # d_pre[r + lag], r = t − (W − 1)
        places = positions + (position,)
        grad_x = zeros
        for lag in tl.static_range(W):
            if IS_VARLEN:  # token r + lag's tap reaches back to r only inside its document
                grad_x += tl.where(lag <= places[lag], taps[W - 1 - lag] * grads[lag], 0.0)
            else:
                grad_x += taps[W - 1 - lag] * grads[lag]
        r = t - (W - 1)
        tl.store(dx_row, grad_x.to(dx.dtype.element_ty), mask=tl.where((r >= first) & (r < last), c_in, False))
        x_row, dy_row, dx_row = x_row + stride_t, dy_row + dy_width, dx_row + C
        x_window, grad_window, positions = (), (), ()  # shifted by one row
        for i in tl.static_range(1, W):
            x_window, grad_window, positions = x_window + (rows[i],), grad_window + (grads[i],), positions + (places[i],)  # fmt: skip  # noqa: E501
    partial = dw_partial + ((b * tl.num_programs(0) + block_t) * C + c).to(tl.int64) * W
    for j in tl.static_range(W):
        tl.store(partial + j, dw[j], mask=c_in)


@triton.jit
def _short_conv_step_kernel(x, weight, history, y, C, stride_b, eps, NORM_C, W: tl.constexpr, BW: tl.constexpr,
                            BC: tl.constexpr, GROUP: tl.constexpr):  # fmt: skip
    """One decoding token: ``y = SiLU(Σ_j w[j] · [history, x][j])`` and the history shifted by one, in place. Only
    this program touches its channels' history; the barrier orders every thread's reads before any thread's writes
    (a slot is read by one thread and may be written by another). With ``GROUP`` > 0 the first ``NORM_C`` channels
    (q and k) are L2-normalised in groups of ``GROUP`` (one group a program; ``y / sqrt(‖y‖² + eps)`` of y as stored,
    what ``l2_normalize`` of the stored y gives), the rest in blocks of ``BC``."""
    block_c, b = tl.program_id(0), tl.program_id(1)
    if GROUP > 0:
        groups = NORM_C // GROUP
        normed = block_c < groups
        start = tl.where(normed, block_c * GROUP, NORM_C + (block_c - groups) * BC)
        end = tl.minimum(tl.where(normed, start + GROUP, start + BC), C)
    else:
        start, end = block_c * BC, C
    c = start + tl.arange(0, BC)
    c_in = c < end
    j = tl.arange(0, BW)  # history slots, oldest first; W − 1 of them are real
    j_in = j < W - 1
    spot = (b.to(tl.int64) * C + c[:, None]) * (W - 1) + j[None, :]
    past = tl.load(history + spot, mask=c_in[:, None] & j_in[None, :], other=0)  # [BC, BW]
    taps = tl.load(weight + c[:, None] * W + j[None, :], mask=c_in[:, None] & j_in[None, :], other=0)
    token = tl.load(x + b.to(tl.int64) * stride_b + c, mask=c_in, other=0)
    last_tap = tl.load(weight + c * W + (W - 1), mask=c_in, other=0).to(tl.float32)
    pre = tl.sum(taps.to(tl.float32) * past.to(tl.float32), axis=1) + last_tap * token.to(tl.float32)
    out = (pre * tl.sigmoid(pre)).to(y.dtype.element_ty)
    if GROUP > 0:
        stored = out.to(tl.float32)
        rnorm = 1 / tl.sqrt(tl.sum(tl.where(c_in, stored * stored, 0), axis=0) + eps)
        out = tl.where(normed, stored * rnorm, stored).to(y.dtype.element_ty)
    tl.store(y + b.to(tl.int64) * C + c, out, mask=c_in)
    tl.debug_barrier()
    tl.store(history + spot - 1, past, mask=c_in[:, None] & j_in[None, :] & (j[None, :] > 0))  # slot j → j − 1
    tl.store(history + (b.to(tl.int64) * C + c) * (W - 1) + (W - 2), token.to(history.dtype.element_ty), mask=c_in)


def short_conv_step(x: Tensor, weight: Tensor, history: Tensor,
                    normalize: tuple[int, int, float] | None = None) -> Tensor:  # fmt: skip
    """One token per row: x ``[B, 1, C]`` (unit column stride), weight ``[C, W]`` contiguous (W ≥ 2), history
    ``[B, C, W − 1]`` contiguous, x's dtype, updated in place → SiLU(conv) ``[B, 1, C]``. ``normalize`` (channels,
    group, eps): the first ``channels`` outputs L2-normalised in groups of ``group`` channels."""
    batch, _, channels = x.shape
    width = weight.shape[1]
    y = new_output((batch, 1, channels), x.dtype, x.device)
    norm_channels, group, eps = normalize or (0, 0, 0.0)
    block = max(BLOCK_C, next_power_of_2(group)) if group else BLOCK_C
    blocks = cdiv(channels - norm_channels, block) + (norm_channels // group if group else 0)
    _short_conv_step_kernel[(blocks, batch)](
        x, weight, history, y, channels, x.stride(0), eps, norm_channels, W=width,
        BW=next_power_of_2(width - 1), BC=block, GROUP=group,
    )  # fmt: skip
    return y


def _launch_shape(x: Tensor, rows: int = BLOCK_T, channels: int = BLOCK_C) -> tuple[int, int, int]:
    return cdiv(x.shape[1], rows), cdiv(x.shape[2], channels), x.shape[0]


MAX_PIECES = 4  # of the output (and its gradient): q, k, v and one extra key stream


def _piece_bounds(pieces: list[Tensor], channels: int) -> tuple[list[Tensor], list[int]]:
    """Up to ``MAX_PIECES`` pieces ``[B, T, c_i]`` (contiguous, ``Σ c_i = channels``) as the kernels' four pointers
    (the last repeated) and the three channel bounds ``e_1 .. e_3`` (``channels`` past the last piece)."""
    widths = [piece.shape[-1] for piece in pieces]
    if not 1 <= len(pieces) <= MAX_PIECES or sum(widths) != channels:
        raise ValueError(f"short conv: expected 1 to {MAX_PIECES} pieces of {channels} channels in all, got widths "
                         f"{widths}")  # fmt: skip
    ends = [sum(widths[: i + 1]) for i in range(len(widths) - 1)]
    return pieces + pieces[-1:] * (MAX_PIECES - len(pieces)), ends + [channels] * (MAX_PIECES - 1 - len(ends))


def short_conv_forward(x: Tensor, weight: Tensor, history: Tensor | None, offset: Tensor | None,
                       widths: list[int]) -> list[Tensor]:  # fmt: skip
    """x ``[B, T, C]`` (unit column stride), weight ``[C, W]`` contiguous, history ``[B, C, W − 1]`` contiguous
    or None, offset ``[T]`` (B = 1) or None → SiLU(conv) as contiguous pieces ``[B, T, w]`` for ``widths``
    (``Σ widths = C``, at most ``MAX_PIECES``), x's dtype."""
    batch, steps, channels = x.shape
    pieces = [new_output((batch, steps, width), x.dtype, x.device) for width in widths]
    pointers, bounds = _piece_bounds(pieces, channels)
    grid = _launch_shape(x)
    reads_history = history is not None and offset is None  # packed documents all start from zeros
    _short_conv_fwd_kernel[grid](x, weight, history, offset, *pointers, *bounds, steps, channels, x.stride(0),
                                 x.stride(1), W=weight.shape[1], BT=BLOCK_T, BC=BLOCK_C, HAS_HISTORY=reads_history,
                                 IS_VARLEN=offset is not None)  # fmt: skip
    return pieces


def short_conv_backward(dys: list[Tensor], x: Tensor, weight: Tensor, history: Tensor | None,
                        offset: Tensor | None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The output's gradient as contiguous pieces ``dys`` (``short_conv_forward``'s widths) → (dx ``[B, T, C]`` in
    x's dtype, dw ``[C, W]`` fp32). The history's gradient is not formed here."""
    batch, steps, channels = x.shape
    pointers, bounds = _piece_bounds(dys, channels)
    grid = _launch_shape(x, BWD_SPAN, BWD_CHANNELS)
    dx = new_output((batch, steps, channels), x.dtype, x.device)
    dw_partial = new_output((batch * grid[0], channels, weight.shape[1]), torch.float32, x.device)
    reads_history = history is not None and offset is None  # packed documents all start from zeros
    _short_conv_bwd_kernel[grid](x, weight, history, offset, *pointers, *bounds, dx, dw_partial, steps, channels,
                                 x.stride(0), x.stride(1), W=weight.shape[1], BC=BWD_CHANNELS, SPAN=BWD_SPAN,
                                 num_warps=BWD_WARPS, HAS_HISTORY=reads_history,
                                 IS_VARLEN=offset is not None)  # fmt: skip
    return dx, dw_partial.sum(0)
