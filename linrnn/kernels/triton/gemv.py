"""Matrix-vector products for decoding: ``y = f(x) Wᵀ (+ b)`` for a few rows of x, bound by reading W once.

cuBLAS's kernels for one to a few rows read a 340M model's weights at about a quarter of the H200's bandwidth
(``benchmarks/RESULTS.md``). Here one program owns ``BN`` output columns (rows of W, each contiguous along K; 2 or 4)
and walks K in blocks of ``BK``, so every load is a contiguous run of a W row, read once for all ``M`` rows of x (at
most ``MAX_ROWS``); the sums are fp32.

``f`` is the input's last elementwise step, done while x is read instead of in a launch of its own (``PROLOGUE``):

- ``NONE``: x as it is;
- ``RMS_NORM``: ``RMSNorm(x + delta) · w`` over the whole row. The row's sum of squares is gathered in the same loop
  as the products and its ``rsqrt`` scales the sums at the end (``Σ_k x_k w_k W_nk · rstd``); with ``delta`` the
  first program also stores ``x + delta`` (the residual stream goes on from it), and the norm reads that sum as
  stored;
- ``GATED_RMS_NORM``: per group of ``GROUP`` columns (a head), ``RMSNorm(x) · w · act(z)``; every group lies inside
  one K block (``GROUP`` a power of two ≤ ``BK``), so each block finds its groups' norms on its own;
- ``SWIGLU``: ``SiLU(a) · b`` for x's row ``[a | b]`` of 2K columns.

Every program computes ``f`` of the whole x row for itself (a few KiB from L2), which costs less than a launch.

``gates`` (``fused.MambaGateColumns``): some output columns are the pre-activations of a Mamba-style decay and of
a write strength β (Gated DeltaNet's ``W_α x`` and ``W_β x`` inside its one projection); the programs that own them
also store ``g = −exp(A_log) · softplus(y + dt_bias)`` and ``β = scale · sigmoid(y)`` (fp32) from the stored
(rounded) y, as ``fused.mamba_gates`` would from the product.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import cdiv, new_output, next_power_of_2
from linrnn.kernels.triton.fused import sigmoid_fp32, softplus_fp32

if TYPE_CHECKING:
    from linrnn.kernels.fused import MambaGateColumns

MAX_ROWS = 8  # beyond this, cuBLAS's GEMM kernels are the faster choice (RESULTS.md)
BLOCK_N = None  # W rows a program (None: by the output's width, below)
MAX_BLOCK_K, WIDE_COLUMNS = 2048, 4096  # K per loop step of a program; outputs this wide count as wide
ELEMENTS_PER_WARP = 2048  # accumulator elements a warp holds (64 fp32 registers a thread)
NONE, RMS_NORM, GATED_RMS_NORM, SWIGLU = (tl.constexpr(kind) for kind in range(4))  # PROLOGUE
# a prologue's launch shape for one row, measured in CUDA graphs at the 340M model's products (H200,
# benchmarks/tune_gemv.py --fused): more W rows and warps a program than the plain product's shape, as each program
# computes the step for itself
PROLOGUE_LAUNCH = {RMS_NORM.value: (8, 512, 2), GATED_RMS_NORM.value: (4, 2048, 4), SWIGLU.value: (4, 1024, 8)}


@triton.jit
def _input_block(x, m, k, mask, x_row, aux, aux_row, norm_w, total, K, eps, first_program,
                 PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, GROUP: tl.constexpr, SIGMOID: tl.constexpr,
                 BM: tl.constexpr, BK: tl.constexpr):  # fmt: skip
    """f(x) at rows m, columns k → (``[BM, BK]`` fp32 block, its squares for RMS_NORM's row sum, else zeros)."""
    xv = tl.load(x + m[:, None] * x_row + k[None, :], mask=mask, other=0)
    squares = tl.zeros([BM, BK], dtype=tl.float32)
    if PROLOGUE == SWIGLU:
        a = xv.to(tl.float32)
        b = tl.load(x + m[:, None] * x_row + K + k[None, :], mask=mask, other=0).to(tl.float32)
        out = a * tl.sigmoid(a) * b
    elif PROLOGUE == RMS_NORM:
        if HAS_DELTA:  # the sum as stored, in x's dtype (the unfused add + norm kernel's rule)
            delta = tl.load(aux + m[:, None] * aux_row + k[None, :], mask=mask, other=0)
            xv = (xv.to(tl.float32) + delta.to(tl.float32)).to(xv.dtype)
            if first_program:
                tl.store(total + m[:, None] * K + k[None, :], xv, mask=mask)
        xf = xv.to(tl.float32)
        w = tl.load(norm_w + k, mask=k < K, other=0).to(tl.float32)
        out = xf * w[None, :]
        squares = xf * xf
    elif PROLOGUE == GATED_RMS_NORM:
        xf = xv.to(tl.float32)
        group_squares = tl.reshape(xf * xf, [BM, BK // GROUP, GROUP])
        rstd = 1 / tl.sqrt(tl.sum(group_squares, axis=2) / GROUP + eps)  # [BM, groups]
        rstd = tl.reshape(tl.broadcast_to(rstd[:, :, None], [BM, BK // GROUP, GROUP]), [BM, BK])
        z = tl.load(aux + m[:, None] * aux_row + k[None, :], mask=mask, other=0).to(tl.float32)
        gate = tl.sigmoid(z) if SIGMOID else z * tl.sigmoid(z)
        w = tl.load(norm_w + k % GROUP, mask=k < K, other=0).to(tl.float32)
        out = xf * rstd * w[None, :] * gate
    else:
        out = xv.to(tl.float32)
    return out, squares


@triton.jit
def _gemv_kernel(x, w, b, y, M, N, K, x_row, y_row, aux, aux_row, norm_w, total, eps,
                 a_log, dt_bias, g, beta, decay_start, decay_columns, beta_start, beta_columns, beta_scale,
                 BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, HAS_BIAS: tl.constexpr,
                 PROLOGUE: tl.constexpr, HAS_DELTA: tl.constexpr, GROUP: tl.constexpr, SIGMOID: tl.constexpr,
                 GATES: tl.constexpr, DECAY_GROUP: tl.constexpr):  # fmt: skip
    """Products summed elementwise over the K blocks and reduced once at the end: no cross-thread reduction
    inside the loop, so a block's loads are not held up behind the previous block's sum."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    n_in, m_in = n < N, m < M
    first_program = tl.program_id(0) == 0
    rows = n.to(tl.int64)[:, None] * K
    acc = tl.zeros([BM, BN, BK], dtype=tl.float32)
    squares = tl.zeros([BM, BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        k_in = k < K
        tile = tl.load(w + rows + k[None, :], mask=n_in[:, None] & k_in[None, :], other=0).to(tl.float32)  # [BN, BK]
        xv, sq = _input_block(x, m, k, m_in[:, None] & k_in[None, :], x_row, aux, aux_row, norm_w, total, K, eps,
                              first_program, PROLOGUE, HAS_DELTA, GROUP, SIGMOID, BM, BK)  # fmt: skip
        squares += sq
        acc += xv[:, None, :] * tile[None, :, :]
    out = tl.sum(acc, axis=2)  # [BM, BN]
    if PROLOGUE == RMS_NORM:
        out *= (1 / tl.sqrt(tl.sum(squares, axis=1) / K + eps))[:, None]
    if HAS_BIAS:
        out += tl.load(b + n, mask=n_in, other=0).to(tl.float32)[None, :]
    out = out.to(y.dtype.element_ty)
    tl.store(y + m[:, None] * y_row + n[None, :], out, mask=m_in[:, None] & n_in[None, :])
    if GATES:  # from the product as stored, as the gates' own kernel reads it
        stored = out.to(tl.float32)
        c = n - decay_start
        in_decay = (c >= 0) & (c < decay_columns)
        rate = tl.exp(tl.load(a_log + c // DECAY_GROUP, mask=in_decay, other=0).to(tl.float32))
        bias = tl.load(dt_bias + c, mask=in_decay, other=0).to(tl.float32)
        tl.store(g + m[:, None] * decay_columns + c[None, :], -rate[None, :] * softplus_fp32(stored + bias[None, :]),
                 mask=m_in[:, None] & in_decay[None, :])  # fmt: skip
        c = n - beta_start
        in_beta = (c >= 0) & (c < beta_columns)
        tl.store(beta + m[:, None] * beta_columns + c[None, :], beta_scale * sigmoid_fp32(stored),
                 mask=m_in[:, None] & in_beta[None, :])  # fmt: skip


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, block_n: int | None = None,
         block_k: int | None = None, num_warps: int | None = None, gates: MambaGateColumns | None = None
         ) -> Tensor:  # fmt: skip
    """x ``[M, K]`` (unit column stride, M ≤ ``MAX_ROWS``), weight ``[N, K]`` contiguous, bias ``[N]`` or None →
    ``x @ weight.T + bias`` ``[M, N]`` contiguous in x's dtype (fp32 sums). ``block_n``, ``block_k`` and
    ``num_warps`` override the launch shape (``benchmarks/tune_gemv.py``); ``gates``: their g and β as well (every
    ``gemv_*`` below takes it too)."""
    return _launch(x, weight, bias, x.shape[1], block_n=block_n, block_k=block_k, num_warps=num_warps, gates=gates)


def gemv_rms_normed(x: Tensor, delta: Tensor | None, norm_weight: Tensor, eps: float, weight: Tensor,
                    bias: Tensor | None = None, gates: MambaGateColumns | None = None
                    ) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """``RMSNorm(x + delta) · norm_weight`` ``@ weight.T + bias``: x, delta ``[M, K]`` (rows at one stride each,
    unit columns), norm_weight ``[K]`` → (``[M, N]``, ``x + delta`` ``[M, K]`` contiguous in x's dtype, or None
    without delta)."""
    total = None if delta is None else new_output(x.shape, x.dtype, x.device)
    y = _launch(x, weight, bias, x.shape[1], prologue=RMS_NORM, aux=delta, norm_weight=norm_weight, total=total,
                eps=eps, gates=gates)  # fmt: skip
    return y, total


def gemv_gated_rms_normed(x: Tensor, z: Tensor, norm_weight: Tensor, eps: float, sigmoid: bool, weight: Tensor,
                          bias: Tensor | None = None, gates: MambaGateColumns | None = None) -> Tensor:  # fmt: skip
    """Per group of ``len(norm_weight)`` columns (a power of two ≤ ``MAX_BLOCK_K``), ``RMSNorm(x) · norm_weight ·
    act(z)`` (act: sigmoid, else SiLU) ``@ weight.T + bias``; x, z ``[M, K]``, rows at one stride each."""
    group = norm_weight.numel()
    return _launch(x, weight, bias, x.shape[1], prologue=GATED_RMS_NORM, aux=z, norm_weight=norm_weight, eps=eps,
                   group=group, sigmoid=sigmoid, min_block_k=group, gates=gates)  # fmt: skip


def gemv_swiglu(x: Tensor, weight: Tensor, bias: Tensor | None = None, gates: MambaGateColumns | None = None
                ) -> Tensor:  # fmt: skip
    """``SiLU(a) · b @ weight.T + bias`` for x ``[M, 2K]`` = ``[a | b]`` (rows at one stride, unit columns)."""
    return _launch(x, weight, bias, x.shape[1] // 2, prologue=SWIGLU, gates=gates)


def _launch(x: Tensor, weight: Tensor, bias: Tensor | None, depth: int, prologue: tl.constexpr = NONE,
            aux: Tensor | None = None, norm_weight: Tensor | None = None, total: Tensor | None = None,
            eps: float = 0.0, group: int = 1, sigmoid: bool = False, min_block_k: int = 1,
            block_n: int | None = None, block_k: int | None = None, num_warps: int | None = None,
            gates: MambaGateColumns | None = None) -> Tensor:  # fmt: skip
    rows = x.shape[0]
    columns = weight.shape[0]
    y = new_output((rows, columns), x.dtype, x.device)
    block_m = next_power_of_2(rows)
    warps = 1
    if prologue.value in PROLOGUE_LAUNCH:  # (W rows, K block, warps) for one row; K blocks shrink as rows grow
        n, k, warps = PROLOGUE_LAUNCH[prologue.value]
        block_n = block_n or BLOCK_N or n
        block_k = block_k or min(max(k // block_m, 64), MAX_BLOCK_K, next_power_of_2(depth))
    else:
        # measured in CUDA graphs at the 340M model's products (H200, benchmarks/tune_gemv.py): wide outputs take 4
        # rows of W a program and K in blocks of 512; narrow ones 2 rows and K whole up to MAX_BLOCK_K
        wide = columns >= WIDE_COLUMNS
        block_n = block_n or BLOCK_N or (4 if wide else 2)
        block_k = block_k or min(512 if wide else MAX_BLOCK_K, next_power_of_2(depth))
    block_k = max(min_block_k, block_k)
    num_warps = num_warps or max(warps, min(8, block_m * block_n * block_k // ELEMENTS_PER_WARP))
    gate_args = (None, None, None, None, 0, 0, 0, 0, 1.0)
    decay_group = 1
    if gates is not None:
        decay_columns = gates.dt_bias.numel()
        decay_group = decay_columns // gates.a_log.numel()
        gates.g = new_output((rows, decay_columns), torch.float32, x.device)
        gates.beta = new_output((rows, gates.beta_columns), torch.float32, x.device)
        gate_args = (gates.a_log, gates.dt_bias, gates.g, gates.beta, gates.decay_start, decay_columns,
                     gates.beta_start, gates.beta_columns, float(gates.beta_scale))  # fmt: skip
    _gemv_kernel[(cdiv(columns, block_n),)](
        x, weight, bias, y, rows, columns, depth, x.stride(0), y.stride(0), aux, 0 if aux is None else aux.stride(0),
        norm_weight, total, eps, *gate_args, BM=block_m, BN=block_n, BK=block_k, HAS_BIAS=bias is not None,
        PROLOGUE=prologue.value,
        HAS_DELTA=prologue.value == RMS_NORM.value and aux is not None, GROUP=group, SIGMOID=sigmoid,
        GATES=gates is not None, DECAY_GROUP=decay_group, num_warps=num_warps,
    )  # fmt: skip
    return y
