"""Masked 2-D tile loads and stores shared by the Triton kernels.

Plain pointer arithmetic with bounds masks: it compiles the same on every Triton from 3.6 on (``tl.make_block_ptr``,
which these replace, was removed in 3.9) and under ``TRITON_INTERPRET=1``. Offsets are int64, so a tensor may hold
more than 2³¹ elements. Elements outside the bounds load as 0 and are never stored.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def tile_offsets(row0, col0, n_rows, n_cols, row_stride, BR: tl.constexpr, BC: tl.constexpr):
    """Offsets ``[BR, BC]`` and in-bounds mask of the tile at ``(row0, col0)`` of a row-major ``n_rows × n_cols``
    matrix with unit column stride."""
    rows = row0 + tl.arange(0, BR)
    cols = col0 + tl.arange(0, BC)
    offsets = rows.to(tl.int64)[:, None] * row_stride + cols[None, :]
    return offsets, (rows < n_rows)[:, None] & (cols < n_cols)[None, :]


@triton.jit
def load_tile(base, row0, col0, n_rows, n_cols, row_stride, BR: tl.constexpr, BC: tl.constexpr):
    """The ``[BR, BC]`` tile at ``(row0, col0)`` of the ``n_rows × n_cols`` matrix at ``base``, 0 out of bounds."""
    offsets, mask = tile_offsets(row0, col0, n_rows, n_cols, row_stride, BR, BC)
    return tl.load(base + offsets, mask=mask, other=0)


@triton.jit
def store_tile(base, value, row0, col0, n_rows, n_cols, row_stride, BR: tl.constexpr, BC: tl.constexpr):
    """Store ``value`` ``[BR, BC]`` (cast to the matrix's dtype) at ``(row0, col0)``, its in-bounds part only."""
    offsets, mask = tile_offsets(row0, col0, n_rows, n_cols, row_stride, BR, BC)
    tl.store(base + offsets, value.to(base.dtype.element_ty), mask=mask)


@triton.jit
def load_row_tile(x, token_stride, bos, length, h, row0, col0, D: tl.constexpr, BR: tl.constexpr, BD: tl.constexpr):
    """``load_head_tile`` of ``x`` whose tokens lie ``token_stride`` elements apart, heads contiguous in a token
    (a column block of wider rows, such as the values' columns of the short convolution's output)."""
    return load_tile(x + bos * token_stride + h * D, row0, col0, length, D, token_stride, BR, BD)


@triton.jit
def load_head_tile(x, bos, length, h, row0, col0, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                   BD: tl.constexpr):  # fmt: skip
    """Rows ``row0 ..`` (in the sequence starting at token ``bos``, of ``length`` tokens) and columns ``col0 ..``
    of head h of ``x`` ``[TT, H, D]``: a ``[BR, BD]`` tile, 0 past the sequence's end or D."""
    return load_row_tile(x, H * D, bos, length, h, row0, col0, D, BR, BD)


@triton.jit
def store_head_tile(x, value, bos, length, h, row0, col0, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                    BD: tl.constexpr):  # fmt: skip
    """Store a ``[BR, BD]`` tile where ``load_head_tile`` reads it, inside the sequence and D only."""
    store_tile(x + (bos * H + h) * D, value, row0, col0, length, D, H * D, BR, BD)
