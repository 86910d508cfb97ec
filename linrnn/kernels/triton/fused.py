"""The model's fused pieces in Triton, forward and backward: the residual add + RMSNorm of the blocks, the gated
RMSNorm of the recurrence output, the L2 norm of the key streams and the SwiGLU product.

Residual add + RMSNorm, per row of the hidden size: ``s = x + delta`` (delta optional), ``y = w · s / rms(s)`` in
the output dtype (the GEMM's, bf16 under autocast), s in x's dtype (the fp32 residual stream). Backward, from the
gradients of y and of s: ``ds = r · (g − n · mean(g · n)) + ds_out`` with ``g = dy · w``, ``n = r · s``; ``dx = ds``,
``d delta = ds`` (delta's dtype), ``dw = Σ_rows dy · n``. Only s is kept for the backward.

Gated RMSNorm, per row of D channels (one token and head), with weight ``w [D]``::

    r = 1 / sqrt(mean(x²) + eps)    n = r · x    y = n · w · SiLU(z)

and its backward, recomputing r and n from x (nothing but the inputs is kept between forward and backward)::

    dz = dy · n · w · SiLU'(z)    dn = dy · w · SiLU(z)    dx = r · (dn − n · mean(dn · n))
    dw = Σ_rows dy · n · SiLU(z)

Rows are (token, head) pairs: row ``i`` of a tensor lives at ``(i // H) · token_stride + (i % H) · D``, so a
column slice of a wider matrix (the gate, out of the mixer's one projection GEMM) is read in place. Arithmetic is
fp32; ``dw`` comes as per-program partial sums that the caller reduces.

L2 norm per row: with ``r = (‖x‖² + eps)^(−1/2)``, ``y = x · r`` and ``dx = r · (dy − y · (y · dy))``, output in a
chosen dtype.

SwiGLU is ``y = SiLU(a) · b`` elementwise, with ``da = dy · b · SiLU'(a)`` and ``db = dy · SiLU(a)``.

GammaNet's fold ``(Γq, Γ⁻¹w)`` and its backward (``dq = Γ d(Γq)``, ``dw = Γ⁻¹ d(Γ⁻¹w)``, ``d log Γ`` as per-program
partial sums over rows) as one launch each way instead of a dozen fp32 elementwise ones.

The Mamba-style log-decay ``g = −exp(A_log) · softplus(pre + dt_bias)`` (GDN per head, KDA per channel), with the
write strength ``β = scale · sigmoid(b)`` beside it when asked, forward only: one launch where the decoding step
otherwise runs ten small ones.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import cdiv, new_output, next_power_of_2

TILE_ELEMENTS = 4096  # rows × padded columns per program: 32 fp32 values per thread and tensor at 4 warps


def _row_block(dim: int) -> dict[str, int]:
    """The launch's rows per program ``BR`` and padded row length ``BD`` for rows of ``dim`` elements."""
    padded = next_power_of_2(dim)
    return {"BR": max(1, min(16, TILE_ELEMENTS // padded)), "BD": padded}


SWIGLU_BLOCK = 1024


@triton.jit
def _row_offsets(row0, n_rows, H, token_stride, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    rows = row0 + tl.arange(0, BR)
    cols = tl.arange(0, BD)
    base = (rows // H).to(tl.int64) * token_stride + (rows % H).to(tl.int64) * D
    return base[:, None] + cols[None, :], (rows < n_rows)[:, None] & (cols < D)[None, :]


@triton.jit
def _gated_norm_fwd_kernel(x, z, w, y, n_rows, H, x_stride, z_stride, eps,
                           D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, SIGMOID: tl.constexpr):  # fmt: skip
    row0 = tl.program_id(0) * BR
    x_at, mask = _row_offsets(row0, n_rows, H, x_stride, D, BR, BD)
    z_at, _ = _row_offsets(row0, n_rows, H, z_stride, D, BR, BD)
    y_at, _ = _row_offsets(row0, n_rows, H, H * D, D, BR, BD)
    xv = tl.load(x + x_at, mask=mask, other=0).to(tl.float32)
    zv = tl.load(z + z_at, mask=mask, other=0).to(tl.float32)
    cols = tl.arange(0, BD)
    wv = tl.load(w + cols, mask=cols < D, other=0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(xv * xv, axis=1) / D + eps)
    gate = tl.sigmoid(zv) if SIGMOID else zv * tl.sigmoid(zv)
    out = xv * rstd[:, None] * wv[None, :] * gate
    tl.store(y + y_at, out.to(y.dtype.element_ty), mask=mask)


@triton.jit
def _gated_norm_bwd_kernel(x, z, w, dy, dx, dz, dw_partial, n_rows, H, x_stride, z_stride, eps,
                           D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr, SIGMOID: tl.constexpr):  # fmt: skip
    row0 = tl.program_id(0) * BR
    x_at, mask = _row_offsets(row0, n_rows, H, x_stride, D, BR, BD)
    z_at, _ = _row_offsets(row0, n_rows, H, z_stride, D, BR, BD)
    dense_at, _ = _row_offsets(row0, n_rows, H, H * D, D, BR, BD)  # dy, dx, dz: contiguous [rows, D]
    xv = tl.load(x + x_at, mask=mask, other=0).to(tl.float32)
    zv = tl.load(z + z_at, mask=mask, other=0).to(tl.float32)
    grad = tl.load(dy + dense_at, mask=mask, other=0).to(tl.float32)
    cols = tl.arange(0, BD)
    wv = tl.load(w + cols, mask=cols < D, other=0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(xv * xv, axis=1) / D + eps)
    normed = xv * rstd[:, None]
    sigmoid = tl.sigmoid(zv)
    if SIGMOID:
        gate = sigmoid
        gate_slope = sigmoid * (1 - sigmoid)
    else:
        gate = zv * sigmoid
        gate_slope = sigmoid * (1 + zv * (1 - sigmoid))
    grad_z = grad * normed * wv[None, :] * gate_slope
    grad_n = grad * wv[None, :] * gate
    grad_x = rstd[:, None] * (grad_n - normed * (tl.sum(grad_n * normed, axis=1) / D)[:, None])
    tl.store(dx + dense_at, grad_x.to(dx.dtype.element_ty), mask=mask)
    tl.store(dz + dense_at, grad_z.to(dz.dtype.element_ty), mask=mask)
    tl.store(dw_partial + tl.program_id(0) * D + cols, tl.sum(grad * normed * gate, axis=0), mask=cols < D)


def _rows(x: Tensor) -> tuple[int, int, int, int]:
    """(rows, heads, D, token stride) of ``[B, T, H, D]`` whose heads and channels are dense."""
    batch, steps, heads, dim = x.shape
    if x.stride(3) != 1 or x.stride(2) != dim or batch > 1 and x.stride(0) != steps * x.stride(1):
        raise ValueError(f"gated_rms_norm: expected [B, T, H, D] with dense tokens, got strides {x.stride()}")
    return batch * steps * heads, heads, dim, x.stride(1)


def gated_rms_norm_forward(x: Tensor, z: Tensor, weight: Tensor, eps: float, gate: str = "silu") -> Tensor:
    """x, z ``[B, T, H, D]`` (heads and channels dense) → ``[B, T, H, D]`` contiguous in x's dtype; ``gate`` "silu"
    or "sigmoid" of z."""
    n_rows, heads, dim, x_stride = _rows(x)
    y = new_output(x.shape, x.dtype, x.device)
    block = _row_block(dim)
    grid = (cdiv(n_rows, block["BR"]),)
    _gated_norm_fwd_kernel[grid](x, z, weight, y, n_rows, heads, x_stride, _rows(z)[3], eps, D=dim,
                                 SIGMOID=gate == "sigmoid", **block)  # fmt: skip
    return y


def gated_rms_norm_backward(dy: Tensor, x: Tensor, z: Tensor, weight: Tensor, eps: float, gate: str = "silu"):
    """→ (dx in x's dtype, dz in z's dtype, both contiguous ``[B, T, H, D]``; dw ``[D]`` fp32)."""
    n_rows, heads, dim, x_stride = _rows(x)
    block = _row_block(dim)
    grid = (cdiv(n_rows, block["BR"]),)
    dx = new_output(x.shape, x.dtype, x.device)
    dz = new_output(z.shape, z.dtype, z.device)
    dw_partial = new_output((grid[0], dim), torch.float32, x.device)
    _gated_norm_bwd_kernel[grid](x, z, weight, dy, dx, dz, dw_partial, n_rows, heads, x_stride, _rows(z)[3], eps,
                                 D=dim, SIGMOID=gate == "sigmoid", **block)  # fmt: skip
    return dx, dz, dw_partial.sum(0)


@triton.jit
def _swiglu_fwd_kernel(both, y, n, cols, row, BLOCK: tl.constexpr):
    """y ``[n / cols, cols]`` contiguous from the halves ``[a | b]`` of rows ``row`` apart (a column slice of a
    wider matrix when decoding)."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = at < n
    spot = at // cols * row + at % cols
    av = tl.load(both + spot, mask=mask, other=0).to(tl.float32)
    bv = tl.load(both + spot + cols, mask=mask, other=0).to(tl.float32)
    tl.store(y + at, (av * tl.sigmoid(av) * bv).to(y.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(both, dy, d_both, n, cols, row, BLOCK: tl.constexpr):
    """d_both ``[n / cols, 2 · cols]`` contiguous (da beside db: the gradient of the one product) from dy
    contiguous and the halves of ``both`` (rows ``row`` apart)."""
    at = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = at < n
    row_index, col = at // cols, at % cols
    spot = row_index * row + col
    av = tl.load(both + spot, mask=mask, other=0).to(tl.float32)
    bv = tl.load(both + spot + cols, mask=mask, other=0).to(tl.float32)
    grad = tl.load(dy + at, mask=mask, other=0).to(tl.float32)
    gate = tl.sigmoid(av)
    out = row_index * (2 * cols) + col
    tl.store(d_both + out, (grad * bv * gate * (1 + av * (1 - gate))).to(d_both.dtype.element_ty), mask=mask)
    tl.store(d_both + out + cols, (grad * av * gate).to(d_both.dtype.element_ty), mask=mask)


def swiglu_forward(both: Tensor) -> Tensor:
    """both ``[..., 2C]`` = ``[a | b]`` with its rows at one stride (contiguous, or a column slice of a wider
    matrix) and unit column stride → SiLU(a) · b ``[..., C]`` contiguous, in both's dtype."""
    cols = both.shape[-1] // 2
    y = new_output((*both.shape[:-1], cols), both.dtype, both.device)
    rows = both.reshape(-1, 2 * cols)  # a view for a column slice: its rows keep their stride
    _swiglu_fwd_kernel[(cdiv(y.numel(), SWIGLU_BLOCK),)](rows, y, y.numel(), cols, rows.stride(0),
                                                                BLOCK=SWIGLU_BLOCK)  # fmt: skip
    return y


def swiglu_backward(dy: Tensor, both: Tensor) -> Tensor:
    """dy ``[..., C]`` contiguous, both as ``swiglu_forward`` reads it → d_both ``[..., 2C]`` contiguous, both's
    dtype."""
    cols = both.shape[-1] // 2
    rows = both.reshape(-1, 2 * cols)
    d_both = new_output(both.shape, both.dtype, both.device)
    _swiglu_bwd_kernel[(cdiv(dy.numel(), SWIGLU_BLOCK),)](rows, dy, d_both, dy.numel(), cols, rows.stride(0),
                                                                 BLOCK=SWIGLU_BLOCK)  # fmt: skip
    return d_both


@triton.jit
def _l2_norm_fwd_kernel(x, y, n_rows, H, x_stride, eps, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    row0 = tl.program_id(0) * BR
    x_at, mask = _row_offsets(row0, n_rows, H, x_stride, D, BR, BD)
    at, _ = _row_offsets(row0, n_rows, 1, D, D, BR, BD)
    xv = tl.load(x + x_at, mask=mask, other=0).to(tl.float32)
    rnorm = 1 / tl.sqrt(tl.sum(xv * xv, axis=1) + eps)
    tl.store(y + at, (xv * rnorm[:, None]).to(y.dtype.element_ty), mask=mask)


@triton.jit
def _l2_norm_bwd_kernel(x, dy, dx, n_rows, H, x_stride, eps, D: tl.constexpr, BR: tl.constexpr,
                        BD: tl.constexpr):  # fmt: skip
    row0 = tl.program_id(0) * BR
    x_at, mask = _row_offsets(row0, n_rows, H, x_stride, D, BR, BD)
    at, _ = _row_offsets(row0, n_rows, 1, D, D, BR, BD)  # dy, dx: contiguous [rows, D]
    xv = tl.load(x + x_at, mask=mask, other=0).to(tl.float32)
    grad = tl.load(dy + at, mask=mask, other=0).to(tl.float32)
    rnorm = 1 / tl.sqrt(tl.sum(xv * xv, axis=1) + eps)
    y = xv * rnorm[:, None]
    along = tl.sum(y * grad, axis=1)
    tl.store(dx + at, ((grad - y * along[:, None]) * rnorm[:, None]).to(dx.dtype.element_ty), mask=mask)


def l2_norm_forward(x: Tensor, eps: float, dtype: torch.dtype, heads: int, token_stride: int) -> Tensor:
    """x ``[..., D]`` of rows ``heads`` per token (dense within a token; tokens ``token_stride`` apart, as a column
    slice of a wider matrix) → ``x / sqrt(‖x‖² + eps)`` over the last dim, contiguous, in ``dtype``."""
    dim = x.shape[-1]
    y = new_output(x.shape, dtype, x.device)
    n_rows = x.numel() // dim
    block = _row_block(dim)
    _l2_norm_fwd_kernel[(cdiv(n_rows, block["BR"]),)](x, y, n_rows, heads, token_stride, eps, D=dim, **block)
    return y


def l2_norm_backward(dy: Tensor, x: Tensor, eps: float, heads: int, token_stride: int) -> Tensor:
    """dy contiguous, x as ``l2_norm_forward`` reads it → dx contiguous, x's dtype."""
    dim = x.shape[-1]
    dx = new_output(x.shape, x.dtype, x.device)
    n_rows = x.numel() // dim
    block = _row_block(dim)
    _l2_norm_bwd_kernel[(cdiv(n_rows, block["BR"]),)](
        x, dy, dx, n_rows, heads, token_stride, eps, D=dim, **block
    )
    return dx


@triton.jit
def _rms_norm_fwd_kernel(x, delta, w, y, s, n_rows, eps, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
                         HAS_DELTA: tl.constexpr):  # fmt: skip
    at, mask = _row_offsets(tl.program_id(0) * BR, n_rows, 1, D, D, BR, BD)
    total = tl.load(x + at, mask=mask, other=0).to(tl.float32)
    if HAS_DELTA:
        total += tl.load(delta + at, mask=mask, other=0).to(tl.float32)
        total = total.to(s.dtype.element_ty)  # normalise the sum as stored, in x's dtype
        tl.store(s + at, total, mask=mask)
        total = total.to(tl.float32)
    cols = tl.arange(0, BD)
    wv = tl.load(w + cols, mask=cols < D, other=0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(total * total, axis=1) / D + eps)
    tl.store(y + at, (total * rstd[:, None] * wv[None, :]).to(y.dtype.element_ty), mask=mask)


@triton.jit
def _rms_norm_bwd_kernel(s, w, dy, ds_out, dx, d_delta, dw_partial, n_rows, eps, D: tl.constexpr, BR: tl.constexpr,
                         BD: tl.constexpr, HAS_DS_OUT: tl.constexpr, HAS_DELTA: tl.constexpr):  # fmt: skip
    at, mask = _row_offsets(tl.program_id(0) * BR, n_rows, 1, D, D, BR, BD)
    total = tl.load(s + at, mask=mask, other=0).to(tl.float32)
    grad = tl.load(dy + at, mask=mask, other=0).to(tl.float32)
    cols = tl.arange(0, BD)
    wv = tl.load(w + cols, mask=cols < D, other=0).to(tl.float32)
    rstd = 1 / tl.sqrt(tl.sum(total * total, axis=1) / D + eps)
    normed = total * rstd[:, None]
    g = grad * wv[None, :]
    grad_s = rstd[:, None] * (g - normed * (tl.sum(g * normed, axis=1) / D)[:, None])
    if HAS_DS_OUT:
        grad_s += tl.load(ds_out + at, mask=mask, other=0).to(tl.float32)
    tl.store(dx + at, grad_s.to(dx.dtype.element_ty), mask=mask)
    if HAS_DELTA:
        tl.store(d_delta + at, grad_s.to(d_delta.dtype.element_ty), mask=mask)
    tl.store(dw_partial + tl.program_id(0) * D + cols, tl.sum(grad * normed, axis=0), mask=cols < D)


def rms_norm_forward(x: Tensor, delta: Tensor | None, weight: Tensor, eps: float,
                     dtype: torch.dtype) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """x, delta contiguous ``[..., D]`` → (y in ``dtype``, s = x + delta in x's dtype, or None without delta)."""
    dim = x.shape[-1]
    n_rows = x.numel() // dim
    y = new_output(x.shape, dtype, x.device)
    s = new_output(x.shape, x.dtype, x.device) if delta is not None else None
    block = _row_block(dim)
    grid = (cdiv(n_rows, block["BR"]),)
    _rms_norm_fwd_kernel[grid](x, delta, weight, y, s, n_rows, eps, D=dim, HAS_DELTA=delta is not None, **block)
    return y, s


def rms_norm_backward(dy: Tensor, ds_out: Tensor | None, s: Tensor, weight: Tensor, eps: float,
                      delta_dtype: torch.dtype | None) -> tuple[Tensor, Tensor | None, Tensor]:  # fmt: skip
    """s: the normalised input (x + delta, or x) → (dx in s's dtype, d delta in ``delta_dtype`` or None, dw fp32)."""
    dim = s.shape[-1]
    n_rows = s.numel() // dim
    block = _row_block(dim)
    grid = (cdiv(n_rows, block["BR"]),)
    dx = new_output(s.shape, s.dtype, s.device)
    d_delta = new_output(s.shape, delta_dtype, s.device) if delta_dtype is not None else None
    dw_partial = new_output((grid[0], dim), torch.float32, s.device)
    _rms_norm_bwd_kernel[grid](
        s,
        weight,
        dy,
        ds_out,
        dx,
        d_delta,
        dw_partial,
        n_rows,
        eps,
        D=dim,
        HAS_DS_OUT=ds_out is not None,
        HAS_DELTA=delta_dtype is not None,
        **block,
    )
    return dx, d_delta, dw_partial.sum(0)


@triton.jit
def _log_decay_kernel(pre, a_log, dt_bias, g, beta_pre, beta, n_rows, row_stride, beta_row_stride,
                      D: tl.constexpr, GROUP: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr,
                      HAS_BETA: tl.constexpr, DB: tl.constexpr, BDB: tl.constexpr,
                      BETA_SCALE: tl.constexpr):  # fmt: skip
    """``g = −exp(a_log[c // GROUP]) · softplus(pre + dt_bias[c])`` (fp32) for ``BR`` rows of D columns; with
    ``HAS_BETA`` also ``β = BETA_SCALE · sigmoid(beta_pre)`` (fp32) for the same rows' DB columns."""
    row0 = tl.program_id(0) * BR
    if HAS_BETA:
        b_at, b_mask = _row_offsets(row0, n_rows, 1, beta_row_stride, DB, BR, BDB)
        b_out, _ = _row_offsets(row0, n_rows, 1, DB, DB, BR, BDB)
        z = tl.load(beta_pre + b_at, mask=b_mask, other=0).to(tl.float32)
        tl.store(beta + b_out, BETA_SCALE * sigmoid_fp32(z), mask=b_mask)
    pre_at, mask = _row_offsets(row0, n_rows, 1, row_stride, D, BR, BD)
    g_at, _ = _row_offsets(row0, n_rows, 1, D, D, BR, BD)
    cols = tl.arange(0, BD)
    x = tl.load(pre + pre_at, mask=mask, other=0).to(tl.float32)
    x += tl.load(dt_bias + cols, mask=cols < D, other=0).to(tl.float32)[None, :]
    rate = tl.exp(tl.load(a_log + cols // GROUP, mask=cols < D, other=0).to(tl.float32))
    tl.store(g + g_at, -rate[None, :] * softplus_fp32(x), mask=mask)


@triton.jit
def sigmoid_fp32(z):
    """``sigmoid(z)`` = 1 / (1 + e^−z) for z ≥ 0, e^z / (1 + e^z) below (no overflow, full fp32 accuracy)."""
    e = _exp_nonpositive(-tl.abs(z))
    return tl.where(z >= 0, 1 / (1 + e), e / (1 + e))


@triton.jit
def softplus_fp32(x):
    """``softplus(x) = max(x, 0) + log1p(exp(−|x|))``; log1p(y) = log(u) · y / (u − 1) with u = 1 + y rounded (exact
    to the last bit where u − 1 loses y's low bits, y itself where u rounds to 1)."""
    y = _exp_nonpositive(-tl.abs(x))
    u = 1 + y
    return tl.maximum(x, 0) + tl.where(u == 1, y, tl.log(u) * (y / (u - 1)))


@triton.jit
def _exp_nonpositive(t):
    """``exp(t)`` for ``t ≤ 0`` to a few ulp of relative accuracy. On the GPU ``tl.exp(t)`` is ``exp2(t · log2 e)``
    with the product rounded to fp32 first, which costs ``|t| · 2⁻²⁴`` relative (2.4e-6 at t = −40); here
    ``t = n ln 2 + r`` with n an integer and |r| ≤ ln 2 / 2 (ln 2 split in two so that ``n · ln2_hi`` is exact),
    and ``exp(t) = 2ⁿ exp(r)`` with 2ⁿ built from its exponent bits. Below −87 (subnormal results) plain tl.exp."""
    n = tl.floor(t * 1.4426950408889634 + 0.5)
    r = (t - n * 0.693359375) + n * 2.12194440e-4  # ln 2 = 0.693359375 − 2.12194440e-4
    two_n = ((tl.maximum(n, -126.0).to(tl.int32) + 127) << 23).to(tl.float32, bitcast=True)
    return tl.where(t > -87.0, two_n * tl.exp(r), tl.exp(t))


def log_decay_forward(pre: Tensor, a_log: Tensor, dt_bias: Tensor, beta_pre: Tensor | None = None,
                      beta_scale: float = 1.0) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """pre ``[rows, C]`` (unit column stride), a_log ``[C / GROUP]``, dt_bias ``[C]`` contiguous → (g ``[rows, C]``
    fp32, β ``[rows, C_β]`` fp32 from ``beta_pre`` ``[rows, C_β]`` (unit column stride) or None). Forward only:
    decoding."""
    n_rows, columns = pre.shape
    g = new_output((n_rows, columns), torch.float32, pre.device)
    beta_columns = 1 if beta_pre is None else beta_pre.shape[1]
    beta = None if beta_pre is None else new_output((n_rows, beta_columns), torch.float32, pre.device)
    block = _row_block(max(columns, beta_columns))
    _log_decay_kernel[(cdiv(n_rows, block["BR"]),)](
        pre, a_log, dt_bias, g, beta_pre, beta, n_rows, pre.stride(0), 0 if beta_pre is None else beta_pre.stride(0),
        D=columns, GROUP=columns // a_log.numel(), BR=block["BR"], BD=next_power_of_2(columns),
        HAS_BETA=beta_pre is not None, DB=beta_columns, BDB=next_power_of_2(beta_columns),
        BETA_SCALE=float(beta_scale),
    )  # fmt: skip
    return g, beta


FOLD_ROWS, FOLD_COLUMNS = 16, 256  # a [16, 256] tile per program: the 4096 elements of TILE_ELEMENTS


@triton.jit
def _fold_fwd_kernel(q, w, gamma, folded_q, folded_w, n_rows, C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    at = rows.to(tl.int64)[:, None] * C + cols[None, :]
    mask = (rows < n_rows)[:, None] & (cols < C)[None, :]
    g = tl.load(gamma + cols, mask=cols < C, other=1.0)[None, :]
    q_values = tl.load(q + at, mask=mask).to(tl.float32)
    tl.store(folded_q + at, (q_values * g).to(folded_q.dtype.element_ty), mask=mask)
    w_values = tl.load(w + at, mask=mask).to(tl.float32)
    # tl.div_rn: the IEEE division, one rounding (plain / is the approximate one on the GPU)
    tl.store(folded_w + at, tl.div_rn(w_values, g).to(folded_w.dtype.element_ty), mask=mask)


@triton.jit
def _fold_bwd_kernel(folded_q, folded_w, gamma, d_folded_q, d_folded_w, dq, dw, d_log_gamma_partial, n_rows,
                     C: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):  # fmt: skip
    rows = tl.program_id(0) * BR + tl.arange(0, BR)
    cols = tl.program_id(1) * BC + tl.arange(0, BC)
    at = rows.to(tl.int64)[:, None] * C + cols[None, :]
    mask = (rows < n_rows)[:, None] & (cols < C)[None, :]
    g = tl.load(gamma + cols, mask=cols < C, other=1.0)[None, :]
    dfq = tl.load(d_folded_q + at, mask=mask, other=0.0).to(tl.float32)
    dfw = tl.load(d_folded_w + at, mask=mask, other=0.0).to(tl.float32)
    tl.store(dq + at, (dfq * g).to(dq.dtype.element_ty), mask=mask)
    tl.store(dw + at, tl.div_rn(dfw, g).to(dw.dtype.element_ty), mask=mask)
    fq = tl.load(folded_q + at, mask=mask, other=0.0).to(tl.float32)
    fw = tl.load(folded_w + at, mask=mask, other=0.0).to(tl.float32)
    partial = tl.sum(fq * dfq - fw * dfw, axis=0)
    tl.store(d_log_gamma_partial + tl.program_id(0) * C + cols, partial, mask=cols < C)


def _fold_grid(x: Tensor) -> tuple[int, int, tuple[int, int]]:
    """(rows, columns, grid) of ``[B, T, H, K]`` contiguous viewed as rows of ``H · K``."""
    columns = x.shape[-1] * x.shape[-2]
    n_rows = x.numel() // columns
    return n_rows, columns, (cdiv(n_rows, FOLD_ROWS), cdiv(columns, FOLD_COLUMNS))


def fold_forward(q: Tensor, w: Tensor, gamma: Tensor) -> tuple[Tensor, Tensor]:
    """GammaNet's fold: q, w ``[B, T, H, K]`` contiguous, Γ ``[H, K]`` fp32 contiguous → ``(Γq, Γ⁻¹w)`` in q's and
    w's dtypes, computed in fp32."""
    n_rows, columns, grid = _fold_grid(q)
    folded_q, folded_w = new_output(q.shape, q.dtype, q.device), new_output(w.shape, w.dtype, w.device)
    _fold_fwd_kernel[grid](q, w, gamma, folded_q, folded_w, n_rows, C=columns, BR=FOLD_ROWS, BC=FOLD_COLUMNS)
    return folded_q, folded_w


def fold_backward(folded_q: Tensor, folded_w: Tensor, gamma: Tensor, d_folded_q: Tensor, d_folded_w: Tensor,
                  dtypes: tuple[torch.dtype, torch.dtype]) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """Back through the fold, all ``[B, T, H, K]`` contiguous: ``(dq = Γ d(Γq), dw = Γ⁻¹ d(Γ⁻¹w))`` in ``dtypes``
    and ``d log Γ = Σ_{B,T} Γq ⊙ d(Γq) − Γ⁻¹w ⊙ d(Γ⁻¹w)`` ``[H, K]`` fp32, from the folded operands as the kernels
    read them and their (fp32) gradients."""
    n_rows, columns, grid = _fold_grid(folded_q)
    dq, dw = (new_output(folded_q.shape, dtype, folded_q.device) for dtype in dtypes)
    partial = new_output((grid[0], columns), torch.float32, folded_q.device)
    _fold_bwd_kernel[grid](folded_q, folded_w, gamma, d_folded_q, d_folded_w, dq, dw, partial, n_rows, C=columns,
                           BR=FOLD_ROWS, BC=FOLD_COLUMNS)  # fmt: skip
    return dq, dw, partial.sum(0).view(gamma.shape)
