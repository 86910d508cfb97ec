"""Triton kernels of the chunkwise forward pass (chunk ``BT = 64``, sub-blocks ``BC = 16``).

The math is ``linrnn/kernels/chunked.py``'s, in the WY/UT form of a tied erase
(``e = w = k``) or without erase (GLA). Per chunk, with ``Γ_r = exp(G_r)`` the
decay from the chunk start and ``A_xy[r, i] = (x_r ⊙ Γ_r/Γ_i)·y_i``::

    T   = (I + Diag(β) A_kk)⁻¹                    A_kk strictly lower
    W_s = T Diag(β) (K ⊙ Γ),   U_v = T Diag(β) V   (no erase: W_s = 0, U_v = Diag(β) V)
    U   = U_v − W_s S                             S: state at the chunk start
    O   = (scale Q ⊙ Γ) S + A_qk U                 A_qk lower with the diagonal, scale inside
    S  ← Diag(Γ_C) S + (K ⊙ Γ_C/Γ)ᵀ U

A gated erase (Gated DeltaNet-2) reads the state along ``r = b ⊙ k``: r replaces k in the rows of A_kk and in
W_s (``T = (I + Diag(β) A_rk)⁻¹``, ``W_s = T Diag(β) (R ⊙ Γ)``); k stays in the columns, A_qk and the state update.

Kernels, in launch order: ``cumsum`` (G, fp32), ``intra`` (A_kk; without per-head decay also A_qk),
``solve_wu`` (T, then W_s and U_v from T's blocks in registers), ``state`` (sequential over chunks: S per
chunk and U), ``output``. A tied erase with no or per-head decay (``chunk.fused_path``) runs no ``intra``: the
solve forms A_kk and T only, the state pass U from T (``U = T Diag(β) (V − Diag(Γ) K S)``: no W_s, no U_v), the
output kernel A_qk.

Decay ratios never overflow: per-head decay masks the exponent ``G_r − G_i`` to
``i ≤ r`` before ``exp``. Per-channel decay computes each 16 × 16 block of A on its
own: an off-diagonal block as one matmul factored through ``G_ref``, the last
step before the row block (``exp(G_r − G_ref) · exp(G_ref − G_i)``, both ≤ 1), a
diagonal block in ``LEVELS`` masked matmuls, each through one reference step per
group of steps (``level_factors``), plus its plain diagonal. So any log-decay ≤ 0 is
exact, with no gate clamp. Padded steps past a sequence's end load as zeros and
their exponents are masked, so they never produce inf or NaN in valid rows.

Every program starts from ``chunk_index[i] = (sequence, chunk in sequence)``; for a
batch of equal lengths the launches pass ``chunk_index = None`` and the length T as
``cu_seqlens``, and the programs compute the same from T (no index tensors: nothing
cached on the device, which a CUDA graph's memory pool would not track).
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.kernels import TRITON_CHUNK
from linrnn.kernels.triton.launch import cached_launch
from linrnn.kernels.triton.tiles import load_head_tile, load_row_tile, load_tile, store_head_tile, store_tile

# Kernels read module globals only as constexpr.
DECAY_NONE, DECAY_HEAD, DECAY_CHANNEL = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
LEVELS = tl.constexpr(4)  # log2(BC): levels of the diagonal blocks' split (``level_factors``)
CHUNK = tl.constexpr(TRITON_CHUNK)  # BT of every launch


@triton.jit
def _sequence_bounds(cu_seqlens, index, n):
    """First and past-the-end token of sequence n. ``index`` (the launch's chunk index or chunk offsets) None: the
    sequences have equal lengths and ``cu_seqlens`` is that length (an int)."""
    if index is None:
        bos, eos = n.to(tl.int64) * cu_seqlens, n.to(tl.int64) * cu_seqlens + cu_seqlens
    else:
        bos, eos = tl.load(cu_seqlens + n).to(tl.int64), tl.load(cu_seqlens + n + 1).to(tl.int64)
    return bos, eos


@triton.jit
def _chunk_bounds(cu_seqlens, chunk_index, i, BT: tl.constexpr):
    """Start token of the sequence, its length, this chunk's index in it and its number of valid steps (equal
    lengths without ``chunk_index``: ``_sequence_bounds``)."""
    if chunk_index is None:
        chunks = tl.cdiv(cu_seqlens, BT)
        n, c = i // chunks, i % chunks
    else:
        n, c = tl.load(chunk_index + 2 * i), tl.load(chunk_index + 2 * i + 1)
    bos, eos = _sequence_bounds(cu_seqlens, chunk_index, n)
    return bos, eos - bos, c, tl.minimum(BT, eos - bos - c * BT)


@cached_launch
@triton.jit
def chunk_cumsum_kernel(
    x, out, extra, cu_seqlens, chunk_index,
    H: tl.constexpr, D: tl.constexpr, BD: tl.constexpr, DE: tl.constexpr, BDE: tl.constexpr, BT: tl.constexpr,
    REVERSE: tl.constexpr, HAS_EXTRA: tl.constexpr,
):  # fmt: skip
    """Cumulative sum inside each chunk of ``x`` ``[TT, H, D]`` (D = 1: per head), in fp32.

    ``REVERSE`` sums from the chunk end (the gradient of a cumsum). ``extra`` ``[NT, H, DE]`` is added to
    the chunk's last valid step first (summed over DE when D = 1, else DE = D). Axis 2: blocks of BD channels."""
    i, h, d0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BD
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    values = load_head_tile(x, bos, length, h, c * BT, d0, H, D, BT, BD).to(tl.float32)
    if HAS_EXTRA:
        if D == 1:
            e_idx = tl.arange(0, BDE)
            added = tl.sum(tl.load(extra + (i * H + h).to(tl.int64) * DE + e_idx, mask=e_idx < DE, other=0), axis=0)
        else:
            e_idx = d0 + tl.arange(0, BD)
            added = tl.load(extra + (i * H + h).to(tl.int64) * DE + e_idx, mask=e_idx < DE, other=0)
        last = (tl.arange(0, BT) == valid - 1)[:, None]
        values += tl.where(last, added, 0.0)
    sums = tl.cumsum(values, axis=0, reverse=REVERSE)
    store_head_tile(out, sums.to(out.dtype.element_ty), bos, length, h, c * BT, d0, H, D, BT, BD)


@triton.jit
def level_factors(g_block, g_x, x_valid, count, k_idx, row_stride, K: tl.constexpr, BC: tl.constexpr,
                  HALF: tl.constexpr):  # fmt: skip
    """One level of the exact split of a ``BC``-step block's strictly lower pairs (r > j), per channel.

    Level ``HALF`` (BC/2, BC/4, .., 1) takes the pairs whose steps fall in one group of ``2·HALF`` steps, r in its
    lower half and j in its upper half, through the group's reference step ``m`` (the upper half's last):
    ``Γ_r/Γ_j = exp(G_r − G_m) · exp(G_m − G_j)``, both factors ≤ 1 because G falls along the chunk, so no gate
    overflows. Over the levels every pair r > j is taken once (the highest bit where r and j differ).
    ``g_block``: G at the block's first step; ``g_x`` ``[BC, BK]``: G of the block; ``count``: its valid steps.
    Returns ``left`` (rows' factors, 0 on upper halves), ``right`` (columns' factors, 0 on lower halves; 0 where
    m is past the end, as no valid row pairs with them) and the level's pair mask ``[BC, BC]``."""
    x = tl.arange(0, BC)
    m = (x // (2 * HALF)) * (2 * HALF) + HALF - 1
    lower = x % (2 * HALF) >= HALF
    g_m = tl.load(g_block + m[:, None] * row_stride + k_idx[None, :], mask=(m < count)[:, None] & (k_idx < K)[None, :],
                  other=0)  # fmt: skip
    lower2 = lower[:, None]
    ok = tl.where(lower, x_valid, m < count)[:, None]
    factor = tl.exp(tl.where(ok, tl.where(lower2, g_x - g_m, g_m - g_x), float("-inf")))
    rows, cols = x[:, None], x[None, :]
    pairs = (rows // (2 * HALF) == cols // (2 * HALF)) & (rows % (2 * HALF) >= HALF) & (cols % (2 * HALF) < HALF)
    return tl.where(lower2, factor, 0.0), tl.where(lower2, 0.0, factor), pairs


@cached_launch
@triton.jit
def chunk_intra_kernel(
    q, k, w, r, G, A_qk, A_kk, A_qw, A_kw, cu_seqlens, chunk_index, scale,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, DECOUPLED: tl.constexpr, READ: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``A_qk`` (no or per-channel decay; scale and diagonal included) and ``A_kk`` (strict), ``[TT, H, BT]``;
    k: the erase direction. ``DECOUPLED`` (a write key w ≠ k) adds ``A_qw`` (scale and diagonal included) and
    ``A_kw`` (strict). ``READ``: the erase reads the state along r (``r = b ⊙ k``, a gated erase), which is then the
    rows of A_kk and A_kw (``A_rk``, ``A_rw``); else r is k.

    Per-channel decay: one program per 16 × 16 block (axis 2); otherwise one per chunk. With per-head decay A_qk
    comes from the output kernel instead (it has Q loaded already); without decay it stays here, because a ``kk``
    product alone gave wrong results for bf16 at K = 256 on an H100 (triton 3.6)."""
    i, h = tl.program_id(0), tl.program_id(1)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    row_stride = H * K
    q, k = q + (bos * H + h) * K, k + (bos * H + h) * K
    r = r + (bos * H + h) * K if READ else k
    a_qk = A_qk + (bos * H + h) * BT
    a_kk = A_kk + (bos * H + h) * BT if ERASE else A_kk
    if DECOUPLED:
        w = w + (bos * H + h) * K
        a_qw, a_kw = A_qw + (bos * H + h) * BT, A_kw + (bos * H + h) * BT

    if DECAY != DECAY_CHANNEL:
        qk = tl.zeros([BT, BT], dtype=tl.float32)
        kk = tl.zeros([BT, BT], dtype=tl.float32)
        qw = tl.zeros([BT, BT], dtype=tl.float32)
        kw = tl.zeros([BT, BT], dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BK)):
            k_t = load_tile(k, c * BT, kb * BK, length, K, row_stride, BT, BK)
            r_t = load_tile(r, c * BT, kb * BK, length, K, row_stride, BT, BK) if READ else k_t
            if DECAY == DECAY_NONE or DECOUPLED:
                q_t = load_tile(q, c * BT, kb * BK, length, K, row_stride, BT, BK)
            if DECAY == DECAY_NONE:
                qk += tl.dot(q_t, tl.trans(k_t), input_precision=PREC)
            if ERASE:
                kk += tl.dot(r_t, tl.trans(k_t), input_precision=PREC)
            if DECOUPLED:
                w_t = load_tile(w, c * BT, kb * BK, length, K, row_stride, BT, BK)
                qw += tl.dot(q_t, tl.trans(w_t), input_precision=PREC)
                kw += tl.dot(r_t, tl.trans(w_t), input_precision=PREC)
        rows, cols = tl.arange(0, BT)[:, None], tl.arange(0, BT)[None, :]
        if DECAY == DECAY_HEAD:
            g_t, _ = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK, DECAY)
            ratio = tl.exp(tl.where(rows >= cols, g_t - tl.trans(g_t), 0.0))  # masked before exp
            kk *= ratio
            qw *= ratio
            kw *= ratio
        if DECAY == DECAY_NONE:
            store_tile(a_qk, tl.where(rows >= cols, qk * scale, 0.0), c * BT, 0, length, BT, H * BT, BT, BT)
        if ERASE:
            store_tile(a_kk, tl.where(rows > cols, kk, 0.0), c * BT, 0, length, BT, H * BT, BT, BT)
        if DECOUPLED:
            store_tile(a_qw, tl.where(rows >= cols, qw * scale, 0.0), c * BT, 0, length, BT, H * BT, BT, BT)
            store_tile(a_kw, tl.where(rows > cols, kw, 0.0), c * BT, 0, length, BT, H * BT, BT, BT)
    else:
        NC: tl.constexpr = BT // BC
        a, b = tl.program_id(2) // NC, tl.program_id(2) % NC
        if a * BC >= valid:  # no valid row in this row block: nothing of this sequence to write
            return
        rows, cols = tl.arange(0, BC)[:, None], tl.arange(0, BC)[None, :]
        row_valid = a * BC + rows < valid
        g = G + (bos * H + h) * K
        qk = tl.zeros([BC, BC], dtype=tl.float32)
        kk = tl.zeros([BC, BC], dtype=tl.float32)
        qw = tl.zeros([BC, BC], dtype=tl.float32)
        kw = tl.zeros([BC, BC], dtype=tl.float32)
        if a > b:
            for kb in range(0, tl.cdiv(K, BK)):
                k_idx = kb * BK + tl.arange(0, BK)
                row_a, row_b, col = c * BT + a * BC, c * BT + b * BC, kb * BK
                q_a = load_tile(q, row_a, col, length, K, row_stride, BC, BK)
                r_a = load_tile(r, row_a, col, length, K, row_stride, BC, BK)  # k unless READ
                g_a = load_tile(g, row_a, col, length, K, row_stride, BC, BK)
                k_b = load_tile(k, row_b, col, length, K, row_stride, BC, BK)
                g_b = load_tile(g, row_b, col, length, K, row_stride, BC, BK)
                g_ref = tl.load(g + (c * BT + a * BC - 1) * row_stride + k_idx, mask=k_idx < K, other=0)
                left = tl.exp(tl.where(row_valid, g_a - g_ref[None, :], 0.0))  # Γ_r/Γ_ref ≤ 1
                right = tl.exp(g_ref[None, :] - g_b)  # Γ_ref/Γ_i ≤ 1 (block b < a is all valid)
                k_right = tl.trans(k_b * right).to(k_b.dtype)
                qk += tl.dot((q_a * left).to(q_a.dtype), k_right, input_precision=PREC)
                if ERASE:
                    kk += tl.dot((r_a * left).to(r_a.dtype), k_right, input_precision=PREC)
                if DECOUPLED:
                    w_b = load_tile(w, row_b, col, length, K, row_stride, BC, BK)
                    w_right = tl.trans(w_b * right).to(w_b.dtype)
                    qw += tl.dot((q_a * left).to(q_a.dtype), w_right, input_precision=PREC)
                    kw += tl.dot((r_a * left).to(r_a.dtype), w_right, input_precision=PREC)
        elif a == b:  # the diagonal block: its lower pairs through one reference step per level, the diagonal plain
            g_block, count = g + (c * BT + a * BC) * row_stride, valid - a * BC
            x_valid = a * BC + tl.arange(0, BC) < valid
            diagonal = rows == cols
            for kb in range(0, tl.cdiv(K, BK)):
                k_idx = kb * BK + tl.arange(0, BK)
                row_a, col = c * BT + a * BC, kb * BK
                q_a = load_tile(q, row_a, col, length, K, row_stride, BC, BK)
                k_a = load_tile(k, row_a, col, length, K, row_stride, BC, BK)
                r_a = load_tile(r, row_a, col, length, K, row_stride, BC, BK) if READ else k_a
                g_a = load_tile(g, row_a, col, length, K, row_stride, BC, BK)
                qk += tl.where(diagonal, tl.sum(q_a.to(tl.float32) * k_a.to(tl.float32), axis=1)[:, None], 0.0)
                if DECOUPLED:
                    w_a = load_tile(w, row_a, col, length, K, row_stride, BC, BK)
                    qw += tl.where(diagonal, tl.sum(q_a.to(tl.float32) * w_a.to(tl.float32), axis=1)[:, None], 0.0)
                for level in tl.static_range(LEVELS):
                    left, right, pairs = level_factors(g_block, g_a, x_valid, count, k_idx, row_stride, K, BC,
                                                       BC >> (level + 1))  # fmt: skip
                    k_right = tl.trans(k_a * right).to(k_a.dtype)
                    q_left = (q_a * left).to(q_a.dtype)
                    qk += tl.where(pairs, tl.dot(q_left, k_right, input_precision=PREC), 0.0)
                    if ERASE:
                        kk += tl.where(pairs, tl.dot((r_a * left).to(r_a.dtype), k_right, input_precision=PREC), 0.0)
                    if DECOUPLED:
                        w_right = tl.trans(w_a * right).to(w_a.dtype)
                        qw += tl.where(pairs, tl.dot(q_left, w_right, input_precision=PREC), 0.0)
                        kw += tl.where(pairs, tl.dot((r_a * left).to(r_a.dtype), w_right, input_precision=PREC), 0.0)
            qk = tl.where(rows >= cols, qk, 0.0)
            kk = tl.where(rows > cols, kk, 0.0)
            qw = tl.where(rows >= cols, qw, 0.0)
            kw = tl.where(rows > cols, kw, 0.0)
        store_tile(a_qk, qk * scale, c * BT + a * BC, b * BC, length, BT, H * BT, BC, BC)
        if ERASE:
            store_tile(a_kk, kk, c * BT + a * BC, b * BC, length, BT, H * BT, BC, BC)
        if DECOUPLED:
            store_tile(a_qw, qw * scale, c * BT + a * BC, b * BC, length, BT, H * BT, BC, BC)
            store_tile(a_kw, kw, c * BT + a * BC, b * BC, length, BT, H * BT, BC, BC)


@triton.jit
def _store_t_times_scaled(t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, x, x_stride, G, out, bos, length, h, r0,
                          valid, col0, b0, b1, b2, b3, H: tl.constexpr, D: tl.constexpr, BC: tl.constexpr,
                          BD: tl.constexpr, DECAY: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """``out = T Diag(β) (X ⊙ Γ)`` on the chunk's rows from ``r0`` and columns ``col0 ..``; ``b0..b3``: β of the
    four row blocks; ``DECAY_NONE``: no Γ. X's tokens lie ``x_stride`` elements apart."""
    x0 = _scaled_rows(x, x_stride, G, bos, length, h, r0, valid, col0, b0, H, D, BC, BD, DECAY)
    x1 = _scaled_rows(x, x_stride, G, bos, length, h, r0 + BC, valid - BC, col0, b1, H, D, BC, BD, DECAY)
    x2 = _scaled_rows(x, x_stride, G, bos, length, h, r0 + 2 * BC, valid - 2 * BC, col0, b2, H, D, BC, BD, DECAY)
    x3 = _scaled_rows(x, x_stride, G, bos, length, h, r0 + 3 * BC, valid - 3 * BC, col0, b3, H, D, BC, BD, DECAY)
    y0, y1, y2, y3 = _lower_times(t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, x0, x1, x2, x3, PREC)
    _store_rows(out, y0, y1, y2, y3, bos, length, h, r0, col0, H, D, BC, BD)


@triton.jit
def _diagonal_inverse(a_base, beta, bos, h, row0, col0, valid, stride, H: tl.constexpr, BC: tl.constexpr,
                      HAS_BETA: tl.constexpr):  # fmt: skip
    """``(I + Diag(β) A)⁻¹`` of the ``[BC, BC]`` diagonal block of A at rows ``row0 ..`` (in the sequence)
    and columns ``col0 ..`` (in the chunk), A strictly lower there, by forward substitution, row by row.
    ``a_base``: the sequence's A ``[length, H, 64]`` at head h; ``valid``: rows of the block in the sequence.
    Each row of A is loaded (an L1 hit): taking it out of a register tile cost a cross-thread reduction and a
    layout change per row."""
    idx = tl.arange(0, BC)
    rows = idx[:, None]
    inverse = (rows == idx[None, :]).to(tl.float32)
    for r in tl.static_range(1, BC):
        ok = r < valid
        # tl.where, not ``(idx < r) & ok``: Triton 3.9's interpreter makes an int32 mask of a block & a scalar
        l_r = tl.load(a_base + (row0 + r).to(tl.int64) * stride + col0 + idx, mask=tl.where(ok, idx < r, False),
                      other=0)  # fmt: skip
        if HAS_BETA:
            l_r *= tl.load(beta + (bos + row0 + r) * H + h, mask=ok, other=0).to(tl.float32)
        inverse = tl.where(rows == r, inverse - tl.sum(l_r[:, None] * inverse, axis=0)[None, :], inverse)
    return inverse


@triton.jit
def _load_block(base, length, row0, col0, stride, BC: tl.constexpr):
    return load_tile(base, row0, col0, length, 64, stride, BC, BC)


@triton.jit
def _store_block(base, value, length, row0, col0, stride, BC: tl.constexpr):
    store_tile(base, value, row0, col0, length, 64, stride, BC, BC)


@triton.jit
def load_decay(G, bos, h, c, valid, k0, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
               DECAY: tl.constexpr):  # fmt: skip
    """G on this chunk, ``[BT, 1]`` (per head) or ``[BT, BK]`` (channels k0..k0+BK), and G at the chunk's last
    valid step, ``[1]`` or ``[BK]``. Padded rows read G_last: ratios against them are 1, never inf."""
    rows = tl.arange(0, BT)[:, None]
    t = bos + c * BT + rows
    last = bos + c * BT + valid - 1
    if DECAY == DECAY_HEAD:
        g_t = tl.load(G + t * H + h, mask=rows < valid, other=0)
        g_last = tl.load(G + last * H + h + tl.zeros([1], dtype=tl.int64))
    else:
        k_idx = k0 + tl.arange(0, BK)
        g_t = tl.load(G + (t * H + h) * K + k_idx[None, :], mask=(rows < valid) & (k_idx[None, :] < K), other=0)
        g_last = tl.load(G + (last * H + h) * K + k_idx, mask=k_idx < K, other=0)
    return tl.where(rows < valid, g_t, g_last[None, :]), g_last


@triton.jit
def _beta(beta, bos, h, start, valid, H: tl.constexpr, N: tl.constexpr, HAS_BETA: tl.constexpr):
    """β of the N steps from ``start`` (in the sequence) as ``[N]`` fp32; 1 without β; 0 past the ``valid`` ones."""
    rows = tl.arange(0, N)
    if HAS_BETA:
        return tl.load(beta + (bos + start + rows) * H + h, mask=rows < valid, other=0).to(tl.float32)
    return tl.where(rows < valid, 1.0, 0.0)


@triton.jit
def _scaled_rows(k, k_stride, G, bos, length, h, row0, valid, k0, b, H: tl.constexpr, K: tl.constexpr,
                 BC: tl.constexpr, BK: tl.constexpr, DECAY: tl.constexpr):  # fmt: skip
    """``Diag(β) (K ⊙ Γ)`` on ``BC`` rows from ``row0`` and columns ``k0 ..``, fp32 ``[BC, BK]``; ``b``: their β
    (0 past the ``valid`` rows). ``DECAY_NONE``: ``Diag(β) K``, for any ``[TT, H, K]`` input whose tokens lie
    ``k_stride`` elements apart."""
    x = load_row_tile(k, k_stride, bos, length, h, row0, k0, K, BC, BK).to(tl.float32)
    x *= b[:, None]
    rows = tl.arange(0, BC)[:, None]
    if DECAY == DECAY_HEAD:
        x *= tl.exp(tl.load(G + (bos + row0 + rows) * H + h, mask=rows < valid, other=0))
    elif DECAY == DECAY_CHANNEL:
        k_idx = k0 + tl.arange(0, BK)[None, :]
        x *= tl.exp(tl.load(G + ((bos + row0 + rows) * H + h) * K + k_idx, mask=(rows < valid) & (k_idx < K),
                            other=0))  # fmt: skip
    return x


@triton.jit
def _pv_rows(A_kw, bv, bos, length, h, row0, b, H: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr,
             PREC: tl.constexpr):  # fmt: skip
    """``−Diag(β) A_kw (βV)`` on ``BC`` rows from ``row0``; ``bv``: βV on the chunk ``[BT, BV]`` fp32."""
    a_kw = load_head_tile(A_kw, bos, length, h, row0, 0, H, BT, BC, BT)
    return -b[:, None] * tl.dot(a_kw, bv, input_precision=PREC)


@triton.jit
def _lower_times(t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, x0, x1, x2, x3, PREC: tl.constexpr):
    """The four row blocks of ``T X``: T block lower triangular in 16 × 16 blocks ``t_ab``, X in row blocks."""
    y0 = tl.dot(t00, x0, input_precision=PREC)
    y1 = tl.dot(t11, x1, tl.dot(t10, x0, input_precision=PREC), input_precision=PREC)
    y2 = tl.dot(t22, x2, tl.dot(t21, x1, tl.dot(t20, x0, input_precision=PREC), input_precision=PREC),
                input_precision=PREC)  # fmt: skip
    y3 = tl.dot(t31, x1, tl.dot(t30, x0, input_precision=PREC), input_precision=PREC)
    y3 = tl.dot(t33, x3, tl.dot(t32, x2, y3, input_precision=PREC), input_precision=PREC)
    return y0, y1, y2, y3


@triton.jit
def _store_rows(x, y0, y1, y2, y3, bos, length, h, row0, col0, H: tl.constexpr, D: tl.constexpr,
                BC: tl.constexpr, BD: tl.constexpr):  # fmt: skip
    """Store four ``[BC, BD]`` row blocks at rows ``row0 ..`` of ``x``, in its dtype."""
    dtype = x.dtype.element_ty
    store_head_tile(x, y0.to(dtype), bos, length, h, row0, col0, H, D, BC, BD)
    store_head_tile(x, y1.to(dtype), bos, length, h, row0 + BC, col0, H, D, BC, BD)
    store_head_tile(x, y2.to(dtype), bos, length, h, row0 + 2 * BC, col0, H, D, BC, BD)
    store_head_tile(x, y3.to(dtype), bos, length, h, row0 + 3 * BC, col0, H, D, BC, BD)


@triton.jit
def _store_block_kk(k, G, out, bos, length, h, r0, valid, stride, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr,
                    BK: tl.constexpr, DECAY: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """Store the chunk's strictly lower ``A_kk[r, i] = (k_r ⊙ Γ_r/Γ_i)·k_i`` (fp32, ``[BT, BT]``) at ``out``, laid
    out as A_kk (chunk rows from ``r0`` in the sequence, ``stride`` between rows). No or per-head decay only."""
    kk = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        k_t = load_head_tile(k, bos, length, h, r0, kb * BK, H, K, BT, BK)
        kk += tl.dot(k_t, tl.trans(k_t), input_precision=PREC)
    idx = tl.arange(0, BT)
    rows, cols = idx[:, None], idx[None, :]
    keep = (rows > cols) & (rows < valid)
    if DECAY == DECAY_HEAD:
        g_t = tl.load(G + (bos + r0 + idx) * H + h, mask=idx < valid, other=0)
        kk *= tl.exp(tl.where(keep, g_t[:, None] - g_t[None, :], 0.0))  # masked before exp
    store_tile(out, tl.where(keep, kk, 0.0), r0, 0, length, BT, stride, BT, BT)


@triton.jit
def _solve_blocks(k, beta, G, A_kk, t_base, bos, length, h, r0, valid, stride, b1, b2, b3, H: tl.constexpr,
                  K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, DECAY: tl.constexpr, HAS_BETA: tl.constexpr,
                  FORM_KK: tl.constexpr, BKK: tl.constexpr, PREC: tl.constexpr):  # fmt: skip
    """The solve kernel's T: its ten nonzero 16 × 16 blocks, returned and stored at ``t_base``; ``b1..b3``: β of
    the row blocks below the first.

    The four diagonal blocks by forward substitution (a chain of cross-thread reductions, fastest in one warp),
    then ``T_ab = −T_aa Σ_{b≤c<a} L_ac T_cb`` (L = Diag(β) A_kk). The substitution is exact fp32; a matmul-only
    inverse (``(I − L)(I + L²)(I + L⁴)(I + L⁸)``) lost up to 3e-3 of T to cancellation for correlated keys with β
    near 2."""
    if FORM_KK:  # A_kk formed here and staged in this chunk's rows of T, then read back by blocks as from A_kk
        a_base = t_base
        _store_block_kk(k, G, t_base, bos, length, h, r0, valid, stride, H, K, BT, BKK, DECAY, PREC)
        tl.debug_barrier()  # the staged A_kk visible to every thread of the program
    else:
        a_base = A_kk + (bos * H + h) * BT
    l10 = b1[:, None] * _load_block(a_base, length, r0 + 16, 0, stride, BC)
    l20 = b2[:, None] * _load_block(a_base, length, r0 + 32, 0, stride, BC)
    l21 = b2[:, None] * _load_block(a_base, length, r0 + 32, 16, stride, BC)
    l30 = b3[:, None] * _load_block(a_base, length, r0 + 48, 0, stride, BC)
    l31 = b3[:, None] * _load_block(a_base, length, r0 + 48, 16, stride, BC)
    l32 = b3[:, None] * _load_block(a_base, length, r0 + 48, 32, stride, BC)
    t00 = _diagonal_inverse(a_base, beta, bos, h, r0, 0, valid, stride, H, BC, HAS_BETA)
    t11 = _diagonal_inverse(a_base, beta, bos, h, r0 + 16, 16, valid - 16, stride, H, BC, HAS_BETA)
    t22 = _diagonal_inverse(a_base, beta, bos, h, r0 + 32, 32, valid - 32, stride, H, BC, HAS_BETA)
    t33 = _diagonal_inverse(a_base, beta, bos, h, r0 + 48, 48, valid - 48, stride, H, BC, HAS_BETA)
    t10 = -tl.dot(t11, tl.dot(l10, t00, input_precision=PREC), input_precision=PREC)
    t21 = -tl.dot(t22, tl.dot(l21, t11, input_precision=PREC), input_precision=PREC)
    t20 = -tl.dot(t22, tl.dot(l20, t00, input_precision=PREC) + tl.dot(l21, t10, input_precision=PREC),
                  input_precision=PREC)  # fmt: skip
    t32 = -tl.dot(t33, tl.dot(l32, t22, input_precision=PREC), input_precision=PREC)
    t31 = -tl.dot(t33, tl.dot(l31, t11, input_precision=PREC) + tl.dot(l32, t21, input_precision=PREC),
                  input_precision=PREC)  # fmt: skip
    t30 = -tl.dot(t33, tl.dot(l30, t00, input_precision=PREC) + tl.dot(l31, t10, input_precision=PREC)
                  + tl.dot(l32, t20, input_precision=PREC), input_precision=PREC)  # fmt: skip
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    if FORM_KK:
        tl.debug_barrier()  # every row of the staged blocks read before T overwrites them
    _store_block(t_base, t00, length, r0, 0, stride, BC)
    _store_block(t_base, zero, length, r0, 16, stride, BC)
    _store_block(t_base, zero, length, r0, 32, stride, BC)
    _store_block(t_base, zero, length, r0, 48, stride, BC)
    _store_block(t_base, t10, length, r0 + 16, 0, stride, BC)
    _store_block(t_base, t11, length, r0 + 16, 16, stride, BC)
    _store_block(t_base, zero, length, r0 + 16, 32, stride, BC)
    _store_block(t_base, zero, length, r0 + 16, 48, stride, BC)
    _store_block(t_base, t20, length, r0 + 32, 0, stride, BC)
    _store_block(t_base, t21, length, r0 + 32, 16, stride, BC)
    _store_block(t_base, t22, length, r0 + 32, 32, stride, BC)
    _store_block(t_base, zero, length, r0 + 32, 48, stride, BC)
    _store_block(t_base, t30, length, r0 + 48, 0, stride, BC)
    _store_block(t_base, t31, length, r0 + 48, 16, stride, BC)
    _store_block(t_base, t32, length, r0 + 48, 32, stride, BC)
    _store_block(t_base, t33, length, r0 + 48, 48, stride, BC)
    return t00, t10, t11, t20, t21, t22, t30, t31, t32, t33


@cached_launch
@triton.jit
def chunk_solve_wu_kernel(
    k, v, beta, G, A_kk, A_kw, T, W_s, U_v, cu_seqlens, chunk_index, v_stride,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    BV: tl.constexpr, DECAY: tl.constexpr, HAS_BETA: tl.constexpr, DECOUPLED: tl.constexpr, LOAD_T: tl.constexpr,
    STORE_W: tl.constexpr, STORE_VALUES: tl.constexpr, FORM_KK: tl.constexpr, BKK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``T = (I + Diag(β) A_kk)⁻¹`` ``[TT, H, 64]`` fp32, then from its blocks in registers
    ``W_s = T Diag(β) (K ⊙ Γ)`` ``[TT, H, K]`` (k: the erase direction) and ``U_v = T Diag(β) V`` ``[TT, H, V]``,
    both in the inputs' dtype; decoupled, ``U_v = T P V`` with ``P = −Diag(β) A_kw Diag(β)``. U_v feeds only the
    state pass: ``STORE_VALUES=False`` skips it, ``STORE_W=False`` W_s. ``LOAD_T``: T is given (an earlier
    forward's), its blocks are loaded instead of solved for, and only W_s and U_v are formed.

    ``FORM_KK`` (no or per-head decay, tied erase): A_kk is formed here from k, by ``BKK`` key columns at a time
    (``A_kk`` unused, nothing of it kept), and staged in the chunk's own rows of T, which the blocks and the
    substitution read as they would A_kk before T overwrites them.

    T by 16 × 16 blocks: ``_solve_blocks``."""
    tl.static_assert(BT == 64 and BC == 16, "the block solve is written out for a 64-step chunk")
    i, h = tl.program_id(0), tl.program_id(1)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    t_base = T + (bos * H + h) * BT
    stride = H * BT
    r0 = c * BT
    b0 = _beta(beta, bos, h, r0, valid, H, BC, HAS_BETA)
    b1 = _beta(beta, bos, h, r0 + 16, valid - 16, H, BC, HAS_BETA)
    b2 = _beta(beta, bos, h, r0 + 32, valid - 32, H, BC, HAS_BETA)
    b3 = _beta(beta, bos, h, r0 + 48, valid - 48, H, BC, HAS_BETA)
    if LOAD_T:
        t00 = _load_block(t_base, length, r0, 0, stride, BC)
        t10 = _load_block(t_base, length, r0 + 16, 0, stride, BC)
        t11 = _load_block(t_base, length, r0 + 16, 16, stride, BC)
        t20 = _load_block(t_base, length, r0 + 32, 0, stride, BC)
        t21 = _load_block(t_base, length, r0 + 32, 16, stride, BC)
        t22 = _load_block(t_base, length, r0 + 32, 32, stride, BC)
        t30 = _load_block(t_base, length, r0 + 48, 0, stride, BC)
        t31 = _load_block(t_base, length, r0 + 48, 16, stride, BC)
        t32 = _load_block(t_base, length, r0 + 48, 32, stride, BC)
        t33 = _load_block(t_base, length, r0 + 48, 48, stride, BC)
    else:
        t00, t10, t11, t20, t21, t22, t30, t31, t32, t33 = _solve_blocks(
            k, beta, G, A_kk, t_base, bos, length, h, r0, valid, stride, b1, b2, b3, H, K, BT, BC, DECAY, HAS_BETA,
            FORM_KK, BKK, PREC,
        )  # fmt: skip

    if STORE_W:
        for kb in range(0, tl.cdiv(K, BK)):
            _store_t_times_scaled(t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, k, H * K, G, W_s, bos, length, h,
                                  r0, valid, kb * BK, b0, b1, b2, b3, H, K, BC, BK, DECAY, PREC)  # fmt: skip
    if DECOUPLED:
        b_all = _beta(beta, bos, h, r0, valid, H, BT, HAS_BETA)
    if STORE_VALUES:  # a constexpr branch: with U_v None the loop must not be compiled at all
        for vb in range(0, tl.cdiv(V, BV)):
            if DECOUPLED:  # row blocks of P V = −Diag(β) A_kw (βV)
                bv = load_row_tile(v, v_stride, bos, length, h, r0, vb * BV, V, BT, BV)
                bv = bv.to(tl.float32) * b_all[:, None]
                x0 = _pv_rows(A_kw, bv, bos, length, h, r0, b0, H, BT, BC, PREC)
                x1 = _pv_rows(A_kw, bv, bos, length, h, r0 + 16, b1, H, BT, BC, PREC)
                x2 = _pv_rows(A_kw, bv, bos, length, h, r0 + 32, b2, H, BT, BC, PREC)
                x3 = _pv_rows(A_kw, bv, bos, length, h, r0 + 48, b3, H, BT, BC, PREC)
                y0, y1, y2, y3 = _lower_times(t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, x0, x1, x2, x3, PREC)
                _store_rows(U_v, y0, y1, y2, y3, bos, length, h, r0, vb * BV, H, V, BC, BV)
            else:
                _store_t_times_scaled(t00, t10, t11, t20, t21, t22, t30, t31, t32, t33, v, v_stride, G, U_v, bos,
                                      length, h, r0, valid, vb * BV, b0, b1, b2, b3, H, V, BC, BV, DECAY_NONE,
                                      PREC)  # fmt: skip


@triton.jit
def state_program(cu_seqlens, chunk_offsets, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr,
                  BV: tl.constexpr):  # fmt: skip
    """What a state-pass program (axis 0: value block, axis 1: sequence × head) owns: its value block, head,
    sequence start and length, first chunk, the offset of its sequence's ``[K, V]`` state in ``[N, H, K, V]``,
    and its ``[BK, BV]`` tile's offsets and mask inside a state."""
    vb, nh = tl.program_id(0), tl.program_id(1)
    n, h = nh // H, nh % H
    bos, eos = _sequence_bounds(cu_seqlens, chunk_offsets, n)
    if chunk_offsets is None:  # equal lengths: cu_seqlens is the length
        first = n.to(tl.int64) * tl.cdiv(cu_seqlens, CHUNK)
    else:
        first = tl.load(chunk_offsets + n).to(tl.int64)
    k_idx, v_idx = tl.arange(0, BK), vb * BV + tl.arange(0, BV)
    state_mask = (k_idx[:, None] < K) & (v_idx[None, :] < V)
    state_offsets = k_idx[:, None] * V + v_idx[None, :]
    return vb, h, bos, eos - bos, first, (n * H + h).to(tl.int64) * K * V, state_offsets, state_mask


@cached_launch
@triton.jit
def chunk_state_fwd_kernel(
    k, w, v, beta, G, T, W_s, U_v, U, states, initial_state, final_state, cu_seqlens, chunk_offsets, v_stride,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, HAS_BETA: tl.constexpr, DECOUPLED: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr, FROM_T: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Sequential over one sequence's chunks for one head and BV value columns; the ``[K, BV]`` state stays in
    registers. Stores each chunk's start state (``states`` ``[NT, H, K, V]``) and, with erase, ``U = U_v − W_s S``.
    Decoupled, the write ``(W ⊙ Γ_C/Γ)ᵀ Diag(β) V`` enters the state on its own.

    ``FROM_T`` (a tied erase along k with no or per-head decay): ``U = T Diag(β) (V − Diag(Γ) K S)`` from T, k and
    v, the same U without W_s and U_v formed, stored and read back (the product K S where W_s S was, and one
    ``[BT, BT] × [BT, BV]`` product with T, both in the inputs' dtype)."""
    vb, h, bos, length, first, sequence_state, state_offsets, state_mask = state_program(
        cu_seqlens, chunk_offsets, H, K, V, BK, BV
    )
    state = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        state += tl.load(initial_state + sequence_state + state_offsets, mask=state_mask, other=0)
    dtype = states.dtype.element_ty
    for c in range(0, tl.cdiv(length, BT).to(tl.int32)):
        valid = tl.minimum(BT, length - c * BT)
        state_in = state.to(dtype)  # [BK, BV]: the operand of this chunk's products with S
        tl.store(states + ((first + c) * H + h) * K * V + state_offsets, state_in, mask=state_mask)
        k_in = load_head_tile(k, bos, length, h, c * BT, 0, H, K, BT, BK)
        if DECAY != DECAY_NONE:
            g_t, g_last = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK, DECAY)
        if ERASE:
            if FROM_T:
                x_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
                k_s = tl.dot(k_in, state_in, input_precision=PREC)
                if DECAY == DECAY_HEAD:
                    k_s *= tl.exp(g_t)
                x_t = (x_t - k_s) * _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)[:, None]
                t_t = load_head_tile(T, bos, length, h, c * BT, 0, H, BT, BT, BT)
                u_t = tl.dot(t_t.to(dtype), x_t.to(dtype), input_precision=PREC)
            else:
                w_t = load_head_tile(W_s, bos, length, h, c * BT, 0, H, K, BT, BK)
                u_t = load_head_tile(U_v, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
                u_t = u_t.to(tl.float32) - tl.dot(w_t, state_in, input_precision=PREC)
            store_head_tile(U, u_t.to(U.dtype.element_ty), bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        else:
            u_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
            if HAS_BETA:
                u_t *= _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)[:, None]
        k_t = k_in.to(tl.float32)
        if DECAY != DECAY_NONE:
            to_chunk_end = tl.exp(g_last[None, :] - g_t)  # Γ_C/Γ
            k_t *= to_chunk_end
            state *= tl.exp(g_last)[:, None]
        state += tl.dot(tl.trans(k_t).to(dtype), u_t.to(dtype), input_precision=PREC)
        if DECOUPLED:
            w_t = load_head_tile(w, bos, length, h, c * BT, 0, H, K, BT, BK).to(tl.float32)
            if DECAY != DECAY_NONE:
                w_t *= to_chunk_end
            x_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
            x_t *= _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)[:, None]
            state += tl.dot(tl.trans(w_t).to(dtype), x_t.to(dtype), input_precision=PREC)
    if STORE_FINAL_STATE:
        tl.store(final_state + sequence_state + state_offsets, state, mask=state_mask)


@cached_launch
@triton.jit
def chunk_output_kernel(
    q, k, v, beta, G, states, U, A_qk, A_qw, o, cu_seqlens, chunk_index, v_stride, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, HAS_BETA: tl.constexpr, DECOUPLED: tl.constexpr,
    FORM_QK: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """``O = (scale Q ⊙ Γ) S + A_qk U [+ A_qw Diag(β) V]`` for one chunk, head and BV value columns.

    ``FORM_QK`` (no or per-head decay): A_qk is formed here (from Q K̃ᵀ, K̃ the erase direction or, without
    erase, the key) and the first value block's programs store it for the backward; else it is read."""
    vb, i, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    dtype = states.dtype.element_ty
    state_base = states + (i * H + h).to(tl.int64) * K * V
    out = tl.zeros([BT, BV], dtype=tl.float32)
    qk = tl.zeros([BT, BT], dtype=tl.float32)
    for kb in range(0, tl.cdiv(K, BK)):
        q_t = load_head_tile(q, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
        if FORM_QK:
            k_t = load_head_tile(k, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            qk += tl.dot(q_t, tl.trans(k_t), input_precision=PREC)
        q_t = q_t.to(tl.float32)
        if DECAY != DECAY_NONE:
            g_t, _ = load_decay(G, bos, h, c, valid, kb * BK, H, K, BT, BK, DECAY)
            q_t *= tl.exp(g_t)
        s_t = load_tile(state_base, kb * BK, vb * BV, K, V, V, BK, BV)
        out += tl.dot((q_t * scale).to(dtype), s_t, input_precision=PREC)
    if not FORM_QK:
        a_t = load_head_tile(A_qk, bos, length, h, c * BT, 0, H, BT, BT, BT)
    else:
        rows, cols = tl.arange(0, BT)[:, None], tl.arange(0, BT)[None, :]
        if DECAY == DECAY_HEAD:
            g_t, _ = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK, DECAY)
            qk *= tl.exp(tl.where(rows >= cols, g_t - tl.trans(g_t), 0.0))  # masked before exp
        a_t = tl.where(rows >= cols, qk * scale, 0.0)
        if vb == 0:
            store_head_tile(A_qk, a_t, bos, length, h, c * BT, 0, H, BT, BT, BT)
    if ERASE:
        u_t = load_head_tile(U, bos, length, h, c * BT, vb * BV, H, V, BT, BV).to(tl.float32)
    else:
        u_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
        if HAS_BETA:
            u_t *= _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)[:, None]
    out += tl.dot(a_t.to(dtype), u_t.to(dtype), input_precision=PREC)
    if DECOUPLED:
        x_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
        x_t *= _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)[:, None]
        a_t = load_head_tile(A_qw, bos, length, h, c * BT, 0, H, BT, BT, BT)
        out += tl.dot(a_t.to(dtype), x_t.to(dtype), input_precision=PREC)
    store_head_tile(o, out.to(o.dtype.element_ty), bos, length, h, c * BT, vb * BV, H, V, BT, BV)
