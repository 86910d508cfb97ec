"""Matrix-vector products for decoding: ``y = x Wᵀ (+ b)`` for a few rows of x, bound by reading W once.

cuBLAS's kernels for one to a few rows read a 340M model's weights at about a quarter of the H200's bandwidth
(``benchmarks/RESULTS.md``). Here one program owns ``BN`` output columns (rows of W, each contiguous along K; 2 or 4)
and walks K in blocks of ``BK``, so every load is a contiguous run of a W row, read once for all ``M`` rows of x (at
most ``MAX_ROWS``); the sums are fp32.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels.triton import new_output

MAX_ROWS = 8  # beyond this, cuBLAS's GEMM kernels are the faster choice (RESULTS.md)
BLOCK_N = None  # W rows a program (None: by the output's width, below)
MAX_BLOCK_K, WIDE_COLUMNS = 2048, 4096  # K per loop step of a program; outputs this wide count as wide
ELEMENTS_PER_WARP = 2048  # accumulator elements a warp holds (64 fp32 registers a thread)


@triton.jit
def _gemv_kernel(x, w, b, y, M, N, K, x_row, y_row, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                 HAS_BIAS: tl.constexpr):  # fmt: skip
    """Products summed elementwise over the K blocks and reduced once at the end: no cross-thread reduction
    inside the loop, so a block's loads are not held up behind the previous block's sum."""
    n = tl.program_id(0) * BN + tl.arange(0, BN)
    m = tl.arange(0, BM)
    n_in, m_in = n < N, m < M
    rows = n.to(tl.int64)[:, None] * K
    acc = tl.zeros([BM, BN, BK], dtype=tl.float32)
    for k0 in range(0, K, BK):
        k = k0 + tl.arange(0, BK)
        k_in = k < K
        tile = tl.load(w + rows + k[None, :], mask=n_in[:, None] & k_in[None, :], other=0).to(tl.float32)  # [BN, BK]
        xv = tl.load(x + m[:, None] * x_row + k[None, :], mask=m_in[:, None] & k_in[None, :], other=0)  # [BM, BK]
        acc += xv.to(tl.float32)[:, None, :] * tile[None, :, :]
    out = tl.sum(acc, axis=2)  # [BM, BN]
    if HAS_BIAS:
        out += tl.load(b + n, mask=n_in, other=0).to(tl.float32)[None, :]
    tl.store(y + m[:, None] * y_row + n[None, :], out.to(y.dtype.element_ty), mask=m_in[:, None] & n_in[None, :])


def gemv(x: Tensor, weight: Tensor, bias: Tensor | None = None, block_n: int | None = None,
         block_k: int | None = None, num_warps: int | None = None) -> Tensor:  # fmt: skip
    """x ``[M, K]`` (unit column stride, M ≤ ``MAX_ROWS``), weight ``[N, K]`` contiguous, bias ``[N]`` or None →
    ``x @ weight.T + bias`` ``[M, N]`` contiguous in x's dtype (fp32 sums). ``block_n``, ``block_k`` and
    ``num_warps`` override the launch shape (``benchmarks/tune_gemv.py``)."""
    rows, depth = x.shape
    columns = weight.shape[0]
    y = new_output((rows, columns), x.dtype, x.device)
    block_m = triton.next_power_of_2(rows)
    # measured in CUDA graphs at the 340M model's products (H200, benchmarks/tune_gemv.py): wide outputs take 4 rows
    # of W a program and K in blocks of 512; narrow ones 2 rows and K whole up to MAX_BLOCK_K
    wide = columns >= WIDE_COLUMNS
    block_n = block_n or BLOCK_N or (4 if wide else 2)
    block_k = block_k or min(512 if wide else MAX_BLOCK_K, triton.next_power_of_2(depth))
    num_warps = num_warps or max(1, min(8, block_m * block_n * block_k // ELEMENTS_PER_WARP))
    _gemv_kernel[(triton.cdiv(columns, block_n),)](
        x, weight, bias, y, rows, columns, depth, x.stride(0), y.stride(0), BM=block_m, BN=block_n, BK=block_k,
        HAS_BIAS=bias is not None, num_warps=num_warps,
    )  # fmt: skip
    return y
