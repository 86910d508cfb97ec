"""Triton kernels of the chunkwise backward pass (the forward and its notation: ``chunk_fwd.py``).

Per chunk, with S the start state, S' the end state, and given dO and dS'::

    dU   = A_qkᵀ dO + (K ⊙ Γ_C/Γ) dS'                       (state pass, reverse, also gives dS)
    dS   = Diag(Γ_C) dS' + (scale Q ⊙ Γ)ᵀ dO − W_sᵀ dU
    dQ̂   = dO Sᵀ,   dǨ = U dS'ᵀ,   dW_s = −dU Sᵀ,   dA_qk = dO Uᵀ
    dT   = dU (Diag(β) V)ᵀ + dW_s (Diag(β) K̂)ᵀ,  d(βV) = Tᵀ dU,  d(βK̂) = Tᵀ dW_s
    dM   = −Tᵀ dT Tᵀ (strictly lower),  dA_kk = Diag(β) dM,  dβ += rowsum(dM ⊙ A_kk)

where ``Q̂ = scale Q ⊙ Γ``, ``K̂ = K ⊙ Γ``, ``Ǩ = K ⊙ Γ_C/Γ`` and T, W_s, U as in the forward.
The pairwise products ``A_xy[r, i] = (x_r ⊙ Γ_r/Γ_i)·y_i`` give ``dx_r = Σ_i dA[r, i] y_i ⊙ Γ_r/Γ_i``
and ``dy_i = Σ_r dA[r, i] x_r ⊙ Γ_r/Γ_i``, computed by the forward's blocks.

Log-decay: every use of a vector x at step t carries Γ_t (x ⊙ Γ, a row of A) or 1/Γ_t (x / Γ, a column of A,
and Ǩ), so ``dG_t = Σ_uses ± x_t ⊙ dx_t``: ``q ⊙ dq + k ⊙ (dk₊ − dk₋)``, where dk₊ comes from K̂ and the rows
of A_kk and dk₋ from Ǩ and the columns of A_kk and A_qk. The chunk's last step also gets
``Γ_C Σ_v S ⊙ dS' + Σ_t Ǩ ⊙ dǨ`` (everything multiplied by Γ_C), and ``dg`` is the reverse cumsum of dG
inside the chunk (G is the chunk-local cumsum of g).

Kernels, in launch order: with ``chunk.STATE_BWD_LOCAL_FIRST``, ``local_du`` (the chunk-local part of dU, in
parallel); ``state_bwd`` (reverse over chunks: dS' per chunk, dU, dS_0); then, for a tied
erase with no or per-head decay (DeltaNet, GDN), ``fused`` (everything else, per chunk); otherwise ``main``
(per chunk and K block: dQ̂, dǨ, dW_s), ``local`` (per chunk: dA_qk, dv, dβ, the solve's gradients dA_kk and
dk₊ from K̂), ``intra`` (gradients through A_qk and A_kk, sums with the parts, dq, dk, dG), then the forward's
cumsum kernel reversed for dg.
"""

from __future__ import annotations

import triton
import triton.language as tl

from linrnn.kernels.triton.chunk_fwd import (
    DECAY_CHANNEL,
    DECAY_HEAD,
    DECAY_NONE,
    LEVELS,
    _beta,
    _chunk_bounds,
    level_factors,
    load_decay,
    state_program,
)
from linrnn.kernels.triton.launch import cached_launch
from linrnn.kernels.triton.tiles import load_head_tile, load_row_tile, load_tile, store_head_tile


@cached_launch
@triton.jit
def chunk_bwd_local_du_kernel(
    A_qk, do, dU, cu_seqlens, chunk_index,
    H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The state pass's chunk-local term, in parallel over chunks: ``dU = A_qkᵀ dO`` (fp32), to which
    ``chunk_state_bwd_kernel(LOCAL_DONE=True)`` adds the state's part."""
    vb, i, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, length, c, _ = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    do_t = load_head_tile(do, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
    dtype = do.dtype.element_ty
    a_t = load_head_tile(A_qk, bos, length, h, c * BT, 0, H, BT, BT, BT)
    du = tl.dot(tl.trans(a_t).to(dtype), do_t.to(dtype), input_precision=PREC)
    store_head_tile(dU, du, bos, length, h, c * BT, vb * BV, H, V, BT, BV)


@cached_launch
@triton.jit
def chunk_state_bwd_kernel(
    q, k, G, W_s, A_qk, do, dU, dstates, d_initial, d_final, cu_seqlens, chunk_offsets, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, USE_FINAL_GRAD: tl.constexpr,
    LOCAL_DONE: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Reverse over one sequence's chunks; stores dS' (the gradient of each chunk's end state) and dU.
    ``LOCAL_DONE``: dU already holds its chunk-local term (``chunk_bwd_local_du_kernel``), so the sequential loop
    only adds the state's part. A decoupled write key's value gradient, which feeds nothing back into dS, is formed
    from the stored dS' by ``chunk_bwd_local_kernel``, off this sequential path."""
    vb, h, bos, length, first, sequence_state, state_offsets, state_mask = state_program(
        cu_seqlens, chunk_offsets, H, K, V, BK, BV
    )
    dstate = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_FINAL_GRAD:
        dstate += tl.load(d_final + sequence_state + state_offsets, mask=state_mask, other=0)
    dtype = dstates.dtype.element_ty
    num_chunks = tl.cdiv(length, BT).to(tl.int32)
    for j in range(0, num_chunks):
        c = num_chunks - 1 - j
        valid = tl.minimum(BT, length - c * BT)
        tl.store(dstates + ((first + c) * H + h) * K * V + state_offsets, dstate.to(dtype), mask=state_mask)
        do_t = load_head_tile(do, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        k_t = load_head_tile(k, bos, length, h, c * BT, 0, H, K, BT, BK).to(tl.float32)
        q_t = load_head_tile(q, bos, length, h, c * BT, 0, H, K, BT, BK).to(tl.float32) * scale
        if DECAY != DECAY_NONE:
            g_t, g_last = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK, DECAY)
            to_chunk_end = tl.exp(g_last[None, :] - g_t)  # Γ_C/Γ
            k_t *= to_chunk_end
            q_t *= tl.exp(g_t)
        if LOCAL_DONE:
            du = load_head_tile(dU, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        else:
            a_t = load_head_tile(A_qk, bos, length, h, c * BT, 0, H, BT, BT, BT)
            du = tl.dot(tl.trans(a_t).to(dtype), do_t.to(dtype), input_precision=PREC)
        du += tl.dot(k_t.to(dtype), dstate.to(dtype), input_precision=PREC)
        store_head_tile(dU, du, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        update = tl.dot(tl.trans(q_t).to(dtype), do_t.to(dtype), input_precision=PREC)
        if ERASE:
            ws_t = load_head_tile(W_s, bos, length, h, c * BT, 0, H, K, BT, BK)
            update -= tl.dot(tl.trans(ws_t).to(dtype), du.to(dtype), input_precision=PREC)
        if DECAY != DECAY_NONE:
            dstate *= tl.exp(g_last)[:, None]
        dstate += update
    if USE_INITIAL_STATE:
        tl.store(d_initial + sequence_state + state_offsets, dstate, mask=state_mask)


@cached_launch
@triton.jit
def chunk_bwd_main_kernel(
    k, w, v, beta, G, states, dstates, U, dU, do, dq, dk_minus, dw_minus, dW_s, dG_last, cu_seqlens, chunk_index,
    v_stride, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, HAS_BETA: tl.constexpr, DECOUPLED: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Per chunk and K block, summing over V: dQ̂ (stored as its part of dq), dǨ (its part of dk₋), dW_s and the
    last step's dG. Decoupled (write values X = Diag(β) V), also ``dW̌ = X dS'ᵀ`` (the part of dw)."""
    kb, i, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    dtype = states.dtype.element_ty
    state_base = (i * H + h).to(tl.int64) * K * V
    b = _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)
    d_qhat = tl.zeros([BT, BK], dtype=tl.float32)
    d_kcheck = tl.zeros([BT, BK], dtype=tl.float32)
    d_wcheck = tl.zeros([BT, BK], dtype=tl.float32)
    d_ws = tl.zeros([BT, BK], dtype=tl.float32)
    d_last = tl.zeros([BK], dtype=tl.float32)
    for vb in range(0, tl.cdiv(V, BV)):
        s_t = load_tile(states + state_base, kb * BK, vb * BV, K, V, V, BK, BV)
        ds_t = load_tile(dstates + state_base, kb * BK, vb * BV, K, V, V, BK, BV)
        do_t = load_head_tile(do, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        if ERASE:
            u_t = load_head_tile(U, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        else:
            v_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV)
            u_t = (v_t.to(tl.float32) * b[:, None]).to(dtype)
        d_qhat += tl.dot(do_t.to(dtype), tl.trans(s_t), input_precision=PREC)
        d_kcheck += tl.dot(u_t.to(dtype), tl.trans(ds_t), input_precision=PREC)
        d_last += tl.sum(s_t.to(tl.float32) * ds_t.to(tl.float32), axis=1)
        if ERASE:
            du_t = load_head_tile(dU, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
            d_ws -= tl.dot(du_t.to(dtype), tl.trans(s_t), input_precision=PREC)
        if DECOUPLED:
            v_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV)
            x_t = v_t.to(tl.float32) * b[:, None]
            d_wcheck += tl.dot(x_t.to(dtype), tl.trans(ds_t), input_precision=PREC)
    d_q = d_qhat * scale
    d_km = d_kcheck
    d_wm = d_wcheck
    if DECAY != DECAY_NONE:
        g_t, g_last = load_decay(G, bos, h, c, valid, kb * BK, H, K, BT, BK, DECAY)
        d_q *= tl.exp(g_t)
        to_end = tl.exp(g_last[None, :] - g_t)
        d_km *= to_end
        d_wm *= to_end
        k_t = load_head_tile(k, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
        d_last = tl.exp(g_last) * d_last + tl.sum(k_t * d_km, axis=0)
        if DECOUPLED:
            w_t = load_head_tile(w, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
            d_last += tl.sum(w_t * d_wm, axis=0)
        k_idx = kb * BK + tl.arange(0, BK)
        tl.store(dG_last + (i * H + h).to(tl.int64) * K + k_idx, d_last, mask=k_idx < K)
    store_head_tile(dq, d_q, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
    store_head_tile(dk_minus, d_km, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
    if ERASE:
        store_head_tile(dW_s, d_ws, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
    if DECOUPLED:
        store_head_tile(dw_minus, d_wm, bos, length, h, c * BT, kb * BK, H, K, BT, BK)


@cached_launch
@triton.jit
def chunk_bwd_local_kernel(
    k, w, v, beta, G, T, A_kk, A_qw, A_kw, U, dU, dstates, do, dW_s, dv, dbeta, dk_plus, dA_qk, dA_qw, dA_kk, dA_kw,
    cu_seqlens, chunk_index, v_stride, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    BK_ALL: tl.constexpr, DECAY: tl.constexpr, ERASE: tl.constexpr, HAS_BETA: tl.constexpr,
    DECOUPLED: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The gradients that stay inside one chunk, per chunk: dA_qk, dv and dβ (summing over V), and with erase
    those through ``W_s = T Diag(β) K̂`` and ``T = (I + Diag(β) A_kk)⁻¹``: dT, dk₊ (from K̂), dA_kk.

    Decoupled (``U_v = T P V``, ``P = −Diag(β) A_kw Diag(β)``, write values X = Diag(β) V): also
    ``dX = A_qwᵀ dO + (W ⊙ Γ_C/Γ) dS'`` (dS' from ``dstates``), ``dA_qw = dO Xᵀ``, ``dP = (Tᵀ dU) Vᵀ``,
    ``dT += dU (P V)ᵀ``, ``dv = Diag(β) dX + Pᵀ Tᵀ dU``, and dA_kw. Over the V blocks only ``M = Σ dU Vᵀ`` and
    ``(T P)ᵀ dU`` are formed; ``dP = Tᵀ M`` and ``dT += M Pᵀ`` follow once after them (four products per V block
    instead of seven, plus dX's two)."""
    i, h = tl.program_id(0), tl.program_id(1)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    dtype = do.dtype.element_ty
    b = _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)
    t_idx = tl.arange(0, BT)
    rows, cols = t_idx[:, None], t_idx[None, :]
    d_aqk = tl.zeros([BT, BT], dtype=tl.float32)
    d_aqw = tl.zeros([BT, BT], dtype=tl.float32)
    d_t = tl.zeros([BT, BT], dtype=tl.float32)
    d_uv = tl.zeros([BT, BT], dtype=tl.float32)  # M = Σ_V dU Vᵀ (decoupled)
    d_beta = tl.zeros([BT], dtype=tl.float32)
    if ERASE:
        t_tile = load_head_tile(T, bos, length, h, c * BT, 0, H, BT, BT, BT)
    if DECOUPLED:
        p_tile = -(b[:, None] * load_head_tile(A_kw, bos, length, h, c * BT, 0, H, BT, BT, BT)
                   * b[None, :])  # fmt: skip
        tp_tile = tl.dot(t_tile, p_tile, input_precision=PREC)  # T P: dv's decoupled term is (T P)ᵀ dU
        a_qw_t = tl.trans(load_head_tile(A_qw, bos, length, h, c * BT, 0, H, BT, BT, BT)).to(dtype)
        w_end = load_head_tile(w, bos, length, h, c * BT, 0, H, K, BT, BK_ALL).to(tl.float32)  # W ⊙ Γ_C/Γ
        if DECAY != DECAY_NONE:  # names of their own: g_t is a [BT, BK] loop variable below
            g_all, g_end = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK_ALL, DECAY)
            w_end *= tl.exp(g_end[None, :] - g_all)
        w_end = w_end.to(dtype)
        dstate_base = dstates + (i * H + h).to(tl.int64) * K * V
    for vb in range(0, tl.cdiv(V, BV)):
        do_t = load_head_tile(do, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        du_t = load_head_tile(dU, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        v_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
        bv_t = v_t * b[:, None]
        if ERASE:
            u_t = load_head_tile(U, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        else:
            u_t = bv_t.to(dtype)
        d_aqk += tl.dot(do_t, tl.trans(u_t), input_precision=PREC)
        if DECOUPLED:
            d_aqw += tl.dot(do_t, tl.trans(bv_t.to(dtype)), input_precision=PREC)
            d_uv += tl.dot(du_t, tl.trans(v_t), input_precision=PREC)
            d_x = tl.dot(a_qw_t, do_t.to(dtype), input_precision=PREC)
            d_x += tl.dot(w_end, load_tile(dstate_base, 0, vb * BV, K, V, V, BK_ALL, BV), input_precision=PREC)
            d_v = d_x * b[:, None] + tl.dot(tl.trans(tp_tile), du_t, input_precision=PREC)
            d_beta += tl.sum(v_t * d_x, axis=1)
        else:
            if ERASE:
                d_t += tl.dot(du_t, tl.trans(bv_t), input_precision=PREC)
                d_bv = tl.dot(tl.trans(t_tile), du_t, input_precision=PREC)  # d(βV)
            else:
                d_bv = du_t
            d_v = d_bv * b[:, None]
            d_beta += tl.sum(v_t * d_bv, axis=1)
        store_head_tile(dv, d_v.to(dv.dtype.element_ty), bos, length, h, c * BT, vb * BV, H, V, BT, BV)
    # stored times scale: the gradient of the pairwise product of q and k, scale taken out
    store_head_tile(dA_qk, tl.where(rows >= cols, d_aqk * scale, 0.0), bos, length, h, c * BT, 0, H, BT, BT, BT)
    if DECOUPLED:
        store_head_tile(dA_qw, tl.where(rows >= cols, d_aqw * scale, 0.0), bos, length, h, c * BT, 0, H, BT, BT, BT)
        d_t += tl.dot(d_uv, tl.trans(p_tile), input_precision=PREC)  # Σ_V dU (P V)ᵀ
        d_p = tl.dot(tl.trans(t_tile), d_uv, input_precision=PREC)  # Σ_V (Tᵀ dU) Vᵀ
    if ERASE:
        for kb in range(0, tl.cdiv(K, BK)):
            k_hat = load_head_tile(k, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
            if DECAY != DECAY_NONE:
                g_t, _ = load_decay(G, bos, h, c, valid, kb * BK, H, K, BT, BK, DECAY)
                decay = tl.exp(g_t)
                k_hat *= decay
            d_ws = load_head_tile(dW_s, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            d_t += tl.dot(d_ws, tl.trans(k_hat * b[:, None]), input_precision=PREC)
            d_bk = tl.dot(tl.trans(t_tile), d_ws, input_precision=PREC)  # d(βK̂)
            d_kp = d_bk * b[:, None]
            if DECAY != DECAY_NONE:
                d_kp *= decay
            store_head_tile(dk_plus, d_kp, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            d_beta += tl.sum(k_hat * d_bk, axis=1)
        d_m = -tl.dot(tl.dot(tl.trans(t_tile), d_t, input_precision=PREC), tl.trans(t_tile), input_precision=PREC)
        d_m = tl.where(rows > cols, d_m, 0.0)
        store_head_tile(dA_kk, d_m * b[:, None], bos, length, h, c * BT, 0, H, BT, BT, BT)
        a_kk = load_head_tile(A_kk, bos, length, h, c * BT, 0, H, BT, BT, BT)
        d_beta += tl.sum(tl.where(rows > cols, d_m * a_kk, 0.0), axis=1)
    if DECOUPLED:
        d_p = tl.where(rows > cols, d_p, 0.0)
        store_head_tile(dA_kw, -(b[:, None] * d_p * b[None, :]), bos, length, h, c * BT, 0, H, BT, BT, BT)
        terms = -d_p * load_head_tile(A_kw, bos, length, h, c * BT, 0, H, BT, BT, BT)
        d_beta += tl.sum(terms * b[None, :], axis=1) + tl.sum(terms * b[:, None], axis=0)
    if HAS_BETA:
        tl.store(dbeta + (bos + c * BT + t_idx) * H + h, d_beta, mask=t_idx < valid)


@cached_launch
@triton.jit
def chunk_bwd_fused_kernel(
    q, k, v, beta, G, T, states, dstates, U, dU, do, dq, dk, dv, dg, dbeta, cu_seqlens, chunk_index, v_stride, scale,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, HAS_BETA: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """Everything after the state pass for one chunk, for a tied erase with no or per-head decay and K ≤ BK,
    with no intermediate in memory.

    The solve's gradients need no dW_s or dT: W_s enters only through ``U = U_v − W_s S = T (βV − βK̂ S)``,
    so ``dT = dU (βV − βK̂ S)ᵀ = dU Uᵀ T⁻ᵀ`` and, with ``D = Tᵀ dU`` (the gradient of βV),
    ``dL = −Tᵀ dT Tᵀ = −D Uᵀ`` (L = Diag(β) A_kk) and ``d(βK̂) = Tᵀ dW_s = −D Sᵀ``. Summing over V blocks:
    dQ̂, dǨ, d(βK̂), dA_qk, dL, dv, dβ's V part; then dq, dA_kk, dk, dβ and dg (the reverse cumsum of dG
    over the chunk). A_kk itself is not read: its part of dβ, ``Σ_i dL[r, i] A_kk[r, i] = k_r · Y_r`` with
    ``Y = (dL ⊙ Γ_r/Γ_i) K``, comes from the product dk needs anyway (``dA_kk K = Diag(β) Y``)."""
    i, h = tl.program_id(0), tl.program_id(1)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    dtype = states.dtype.element_ty
    state_base = (i * H + h).to(tl.int64) * K * V
    b = _beta(beta, bos, h, c * BT, valid, H, BT, HAS_BETA)
    t_idx = tl.arange(0, BT)
    rows, cols = t_idx[:, None], t_idx[None, :]
    t_tile = load_head_tile(T, bos, length, h, c * BT, 0, H, BT, BT, BT)
    d_qhat = tl.zeros([BT, BK], dtype=tl.float32)
    d_kcheck = tl.zeros([BT, BK], dtype=tl.float32)
    d_bk = tl.zeros([BT, BK], dtype=tl.float32)  # d(βK̂)
    d_last = tl.zeros([BK], dtype=tl.float32)
    d_aqk = tl.zeros([BT, BT], dtype=tl.float32)
    d_l = tl.zeros([BT, BT], dtype=tl.float32)
    d_beta = tl.zeros([BT], dtype=tl.float32)
    for vb in range(0, tl.cdiv(V, BV)):
        s_t = load_tile(states + state_base, 0, vb * BV, K, V, V, BK, BV)
        ds_t = load_tile(dstates + state_base, 0, vb * BV, K, V, V, BK, BV)
        do_t = load_head_tile(do, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        u_t = load_head_tile(U, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        du_t = load_head_tile(dU, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        v_t = load_row_tile(v, v_stride, bos, length, h, c * BT, vb * BV, V, BT, BV).to(tl.float32)
        d_bv = tl.dot(tl.trans(t_tile), du_t, input_precision=PREC)  # D: d(βV)
        d_v = (d_bv * b[:, None]).to(dv.dtype.element_ty)
        store_head_tile(dv, d_v, bos, length, h, c * BT, vb * BV, H, V, BT, BV)
        d_beta += tl.sum(v_t * d_bv, axis=1)
        d_aqk += tl.dot(do_t, tl.trans(u_t), input_precision=PREC)
        d_l -= tl.dot(d_bv.to(dtype), tl.trans(u_t), input_precision=PREC)
        d_qhat += tl.dot(do_t, tl.trans(s_t), input_precision=PREC)
        d_kcheck += tl.dot(u_t, tl.trans(ds_t), input_precision=PREC)
        d_bk -= tl.dot(d_bv.to(dtype), tl.trans(s_t), input_precision=PREC)
        d_last += tl.sum(s_t.to(tl.float32) * ds_t.to(tl.float32), axis=1)
    # after the loop, in an order that keeps few [BT, BK] tiles live (per-head decay spilled registers otherwise)
    k_t = load_head_tile(k, bos, length, h, c * BT, 0, H, K, BT, BK).to(tl.float32)
    d_aqk = tl.where(rows >= cols, d_aqk * scale, 0.0)
    d_l = tl.where(rows > cols, d_l, 0.0)
    d_q = d_qhat * scale
    if DECAY == DECAY_HEAD:
        g_t, g_last = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK, DECAY)
        ratio = tl.exp(tl.where(rows >= cols, g_t - tl.trans(g_t), 0.0))  # masked before exp
        d_aqk *= ratio
        d_l *= ratio
        d_q *= tl.exp(g_t)
    d_akk = d_l * b[:, None]  # with the decay ratios
    d_q += tl.dot(d_aqk, k_t, input_precision=PREC)
    store_head_tile(dq, d_q.to(dq.dtype.element_ty), bos, length, h, c * BT, 0, H, K, BT, BK)
    q_t = load_head_tile(q, bos, length, h, c * BT, 0, H, K, BT, BK).to(tl.float32)
    if DECAY == DECAY_HEAD:
        d_g = tl.sum(q_t * d_q, axis=1)
        k_hat = k_t * tl.exp(g_t)
        d_beta += tl.sum(k_hat * d_bk, axis=1)
        d_kp = d_bk * (b[:, None] * tl.exp(g_t))
        d_kcheck *= tl.exp(g_last[None, :] - g_t)
        # the chunk's last step: the decay of the carried state and of every write into it
        last = tl.sum(tl.exp(g_last) * d_last + tl.sum(k_t * d_kcheck, axis=0), axis=0)
    else:
        d_beta += tl.sum(k_t * d_bk, axis=1)
        d_kp = d_bk * b[:, None]
    d_lk = tl.dot(d_l, k_t, input_precision=PREC)  # Y
    d_beta += tl.sum(k_t * d_lk, axis=1)
    if HAS_BETA:
        d_beta = d_beta.to(dbeta.dtype.element_ty)
        tl.store(dbeta + (bos + c * BT + t_idx) * H + h, d_beta, mask=t_idx < valid)
    d_kp += d_lk * b[:, None]
    if DECAY == DECAY_HEAD:
        d_g += tl.sum(k_t * d_kp, axis=1)
    d_km = d_kcheck + tl.dot(tl.trans(d_akk), k_t, input_precision=PREC)
    d_km += tl.dot(tl.trans(d_aqk), q_t, input_precision=PREC)
    store_head_tile(dk, (d_kp + d_km).to(dk.dtype.element_ty), bos, length, h, c * BT, 0, H, K, BT, BK)
    if DECAY == DECAY_HEAD:
        d_g -= tl.sum(k_t * d_km, axis=1)
        d_g = tl.where(t_idx == valid - 1, d_g + last, d_g)
        d_g = tl.cumsum(tl.where(t_idx < valid, d_g, 0.0), axis=0, reverse=True)
        tl.store(dg + (bos + c * BT + t_idx) * H + h, d_g.to(dg.dtype.element_ty), mask=t_idx < valid)


@cached_launch
@triton.jit
def chunk_bwd_intra_kernel(
    q, k, w, r, G, dA_qk, dA_kk, dA_qw, dA_kw, dq_part, dk_minus, dk_plus, dw_minus, dq, dk, dw, dr, dG, gamma,
    d_log_gamma_partial, cu_seqlens, chunk_index,
    H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, DECOUPLED: tl.constexpr, READ: tl.constexpr, FOLD: tl.constexpr,
    PREC: tl.constexpr,
):  # fmt: skip
    """Gradients through ``A_qk`` (``dA_qk`` comes with the scale applied) and ``A_kk``, added to the parts from
    the other kernels: dq, dk (inputs' dtypes) and dG (fp32; per head ``[TT, H]``, per channel ``[TT, H, K]``).
    Decoupled, also through ``A_qw`` and ``A_kw`` (w in the columns): dw, every use of w being a column one.
    ``READ`` (a separate read vector r in the rows of A_kk and A_kw, and in K̂): the row uses' gradient dk₊ goes to
    dr (fp32) and dk keeps the column uses' dk₋; else both are k's.

    ``FOLD`` (GammaNet, per-channel decay only: q and w are the folded ``Γq``, ``Γ⁻¹w``): dq and dw back through
    the fold, ``Γ d(Γq)`` and ``Γ⁻¹ d(Γ⁻¹w)`` from the fp32 sums, and each program's part of
    ``d log Γ = Σ_t Γq ⊙ d(Γq) − Γ⁻¹w ⊙ d(Γ⁻¹w)`` (with the operands as read) in ``d_log_gamma_partial``
    ``[NT · BT/BC, H, K]``."""
    tl.static_assert(not FOLD or DECAY == DECAY_CHANNEL, "the fold is fused for per-channel decay only")
    i, h = tl.program_id(0), tl.program_id(1)
    bos, length, c, valid = _chunk_bounds(cu_seqlens, chunk_index, i, BT)
    if DECAY != DECAY_CHANNEL:
        rows, cols = tl.arange(0, BT)[:, None], tl.arange(0, BT)[None, :]
        d_aqk = load_head_tile(dA_qk, bos, length, h, c * BT, 0, H, BT, BT, BT)
        d_akk = tl.zeros([BT, BT], dtype=tl.float32)
        if ERASE:
            d_akk = load_head_tile(dA_kk, bos, length, h, c * BT, 0, H, BT, BT, BT)
        d_aqw = tl.zeros([BT, BT], dtype=tl.float32)
        d_akw = tl.zeros([BT, BT], dtype=tl.float32)
        if DECOUPLED:
            d_aqw = load_head_tile(dA_qw, bos, length, h, c * BT, 0, H, BT, BT, BT)
            d_akw = load_head_tile(dA_kw, bos, length, h, c * BT, 0, H, BT, BT, BT)
        if DECAY == DECAY_HEAD:
            g_t, _ = load_decay(G, bos, h, c, valid, 0, H, K, BT, BK, DECAY)
            ratio = tl.exp(tl.where(rows >= cols, g_t - tl.trans(g_t), 0.0))
            d_aqk *= ratio
            d_akk *= ratio
            d_aqw *= ratio
            d_akw *= ratio
        d_aqk = tl.where(rows >= cols, d_aqk, 0.0)
        d_akk = tl.where(rows > cols, d_akk, 0.0)
        d_aqw = tl.where(rows >= cols, d_aqw, 0.0)
        d_akw = tl.where(rows > cols, d_akw, 0.0)
        d_g = tl.zeros([BT], dtype=tl.float32)
        for kb in range(0, tl.cdiv(K, BK)):
            q_t = load_head_tile(q, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
            k_t = load_head_tile(k, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
            r_t = k_t
            if READ:
                r_t = load_head_tile(r, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
            d_q = load_head_tile(dq_part, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            d_km = load_head_tile(dk_minus, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            d_q += tl.dot(d_aqk, k_t, input_precision=PREC)
            d_km += tl.dot(tl.trans(d_aqk), q_t, input_precision=PREC)
            d_kp = tl.zeros([BT, BK], dtype=tl.float32)
            if ERASE:
                d_kp += load_head_tile(dk_plus, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
                d_kp += tl.dot(d_akk, k_t, input_precision=PREC)
                d_km += tl.dot(tl.trans(d_akk), r_t, input_precision=PREC)
            if DECOUPLED:
                w_t = load_head_tile(w, bos, length, h, c * BT, kb * BK, H, K, BT, BK).to(tl.float32)
                d_q += tl.dot(d_aqw, w_t, input_precision=PREC)
                d_kp += tl.dot(d_akw, w_t, input_precision=PREC)
                d_wm = load_head_tile(dw_minus, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
                d_wm += tl.dot(tl.trans(d_aqw), q_t, input_precision=PREC)
                d_wm += tl.dot(tl.trans(d_akw), r_t, input_precision=PREC)
                store_head_tile(dw, d_wm.to(dw.dtype.element_ty), bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            store_head_tile(dq, d_q.to(dq.dtype.element_ty), bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            if READ:
                store_head_tile(dk, d_km.to(dk.dtype.element_ty), bos, length, h, c * BT, kb * BK, H, K, BT, BK)
                store_head_tile(dr, d_kp, bos, length, h, c * BT, kb * BK, H, K, BT, BK)
            else:
                store_head_tile(dk, (d_kp + d_km).to(dk.dtype.element_ty), bos, length, h, c * BT, kb * BK, H, K, BT,
                                BK)  # fmt: skip
            if DECAY == DECAY_HEAD:
                d_g += tl.sum(q_t * d_q + r_t * d_kp - k_t * d_km, axis=1)
                if DECOUPLED:
                    d_g -= tl.sum(w_t * d_wm, axis=1)
        if DECAY == DECAY_HEAD:
            t_idx = tl.arange(0, BT)
            tl.store(dG + (bos + c * BT + t_idx) * H + h, d_g, mask=t_idx < valid)
    else:
        NC: tl.constexpr = BT // BC
        NK = tl.cdiv(K, BK)
        s, kb = tl.program_id(2) // NK, tl.program_id(2) % NK
        r0 = s * BC
        if r0 >= valid:
            return
        rows, cols = tl.arange(0, BC)[:, None], tl.arange(0, BC)[None, :]
        row_valid = r0 + rows < valid
        row_stride = H * K
        qh, kh, gh = q + (bos * H + h) * K, k + (bos * H + h) * K, G + (bos * H + h) * K
        a_qk = dA_qk + (bos * H + h) * BT
        a_kk = dA_kk + (bos * H + h) * BT if ERASE else dA_kk
        if DECOUPLED:
            wh = w + (bos * H + h) * K
            a_qw, a_kw = dA_qw + (bos * H + h) * BT, dA_kw + (bos * H + h) * BT
        k_idx = kb * BK + tl.arange(0, BK)
        k_mask = k_idx < K
        row_s, col = c * BT + r0, kb * BK
        q_s = load_tile(qh, row_s, col, length, K, row_stride, BC, BK).to(tl.float32)
        k_s = load_tile(kh, row_s, col, length, K, row_stride, BC, BK).to(tl.float32)
        rh = r + (bos * H + h) * K if READ else kh
        r_s = load_tile(rh, row_s, col, length, K, row_stride, BC, BK).to(tl.float32) if READ else k_s
        g_s = load_tile(gh, row_s, col, length, K, row_stride, BC, BK)
        d_q = tl.zeros([BC, BK], dtype=tl.float32)
        d_kp = tl.zeros([BC, BK], dtype=tl.float32)
        d_km = tl.zeros([BC, BK], dtype=tl.float32)
        d_wm = tl.zeros([BC, BK], dtype=tl.float32)
        if s > 0:  # rows of block s against the columns before it, through G_ref = G[r0 − 1]
            g_ref = tl.load(gh + (c * BT + r0 - 1) * row_stride + k_idx, mask=k_mask, other=0)
            acc_q = tl.zeros([BC, BK], dtype=tl.float32)
            acc_k = tl.zeros([BC, BK], dtype=tl.float32)
            for b in range(0, s):
                row_b = c * BT + b * BC
                k_b = load_tile(kh, row_b, col, length, K, row_stride, BC, BK).to(tl.float32)
                g_b = load_tile(gh, row_b, col, length, K, row_stride, BC, BK)
                k_right = k_b * tl.exp(g_ref[None, :] - g_b)
                d_block = load_tile(a_qk, row_s, b * BC, length, BT, H * BT, BC, BC)
                acc_q += tl.dot(d_block, k_right, input_precision=PREC)
                if ERASE:
                    d_block = load_tile(a_kk, row_s, b * BC, length, BT, H * BT, BC, BC)
                    acc_k += tl.dot(d_block, k_right, input_precision=PREC)
                if DECOUPLED:
                    w_b = load_tile(wh, row_b, col, length, K, row_stride, BC, BK).to(tl.float32)
                    w_right = w_b * tl.exp(g_ref[None, :] - g_b)
                    d_block = load_tile(a_qw, row_s, b * BC, length, BT, H * BT, BC, BC)
                    acc_q += tl.dot(d_block, w_right, input_precision=PREC)
                    d_block = load_tile(a_kw, row_s, b * BC, length, BT, H * BT, BC, BC)
                    acc_k += tl.dot(d_block, w_right, input_precision=PREC)
            left = tl.exp(tl.where(row_valid, g_s - g_ref[None, :], 0.0))
            d_q += acc_q * left
            d_kp += acc_k * left
        if r0 + BC < valid:  # columns of block s against the rows after it, through G_ref = G[r0 + BC − 1]
            g_ref = tl.load(gh + (c * BT + r0 + BC - 1) * row_stride + k_idx, mask=k_mask, other=0)
            acc = tl.zeros([BC, BK], dtype=tl.float32)
            acc_w = tl.zeros([BC, BK], dtype=tl.float32)
            for a in range(s + 1, NC):
                row_a = c * BT + a * BC
                q_a = load_tile(qh, row_a, col, length, K, row_stride, BC, BK).to(tl.float32)
                g_a = load_tile(gh, row_a, col, length, K, row_stride, BC, BK)
                factor = tl.exp(tl.where(a * BC + rows < valid, g_a - g_ref[None, :], 0.0))
                d_block = load_tile(a_qk, row_a, r0, length, BT, H * BT, BC, BC)
                acc += tl.dot(tl.trans(d_block), q_a * factor, input_precision=PREC)
                if ERASE:
                    r_a = load_tile(rh, row_a, col, length, K, row_stride, BC, BK).to(tl.float32)
                    d_block = load_tile(a_kk, row_a, r0, length, BT, H * BT, BC, BC)
                    acc += tl.dot(tl.trans(d_block), r_a * factor, input_precision=PREC)
                if DECOUPLED:
                    r_a = load_tile(rh, row_a, col, length, K, row_stride, BC, BK).to(tl.float32)
                    d_block = load_tile(a_qw, row_a, r0, length, BT, H * BT, BC, BC)
                    acc_w += tl.dot(tl.trans(d_block), q_a * factor, input_precision=PREC)
                    d_block = load_tile(a_kw, row_a, r0, length, BT, H * BT, BC, BC)
                    acc_w += tl.dot(tl.trans(d_block), r_a * factor, input_precision=PREC)
            d_km += acc * tl.exp(g_ref[None, :] - g_s)
            d_wm += acc_w * tl.exp(g_ref[None, :] - g_s)
        d_aqk = tl.where(rows >= cols, load_tile(a_qk, row_s, r0, length, BT, H * BT, BC, BC), 0.0)
        d_akk = tl.zeros([BC, BC], dtype=tl.float32)
        if ERASE:
            d_akk = tl.where(rows > cols, load_tile(a_kk, row_s, r0, length, BT, H * BT, BC, BC), 0.0)
        d_aqw = tl.zeros([BC, BC], dtype=tl.float32)
        d_akw = tl.zeros([BC, BC], dtype=tl.float32)
        if DECOUPLED:
            d_aqw = tl.where(rows >= cols, load_tile(a_qw, row_s, r0, length, BT, H * BT, BC, BC), 0.0)
            d_akw = tl.where(rows > cols, load_tile(a_kw, row_s, r0, length, BT, H * BT, BC, BC), 0.0)
            w_s = load_tile(wh, row_s, col, length, K, row_stride, BC, BK).to(tl.float32)
        # the diagonal block: its diagonal plain, its lower pairs level by level through reference steps
        diagonal = rows == cols
        diag_qk = tl.sum(tl.where(diagonal, d_aqk, 0.0), axis=1)[:, None]
        d_q += diag_qk * k_s
        d_km += diag_qk * q_s
        if DECOUPLED:
            diag_qw = tl.sum(tl.where(diagonal, d_aqw, 0.0), axis=1)[:, None]
            d_q += diag_qw * w_s
            d_wm += diag_qw * q_s
        g_block, x_valid = gh + (c * BT + r0) * row_stride, r0 + tl.arange(0, BC) < valid
        for level in tl.static_range(LEVELS):
            left, right, pairs = level_factors(g_block, g_s, x_valid, valid - r0, k_idx, row_stride, K, BC,
                                               BC >> (level + 1))  # fmt: skip
            q_left, r_left, k_right = q_s * left, r_s * left, k_s * right
            level_qk = tl.where(pairs, d_aqk, 0.0)
            d_q += left * tl.dot(level_qk, k_right, input_precision=PREC)
            down = tl.dot(tl.trans(level_qk), q_left, input_precision=PREC)
            if ERASE:
                level_kk = tl.where(pairs, d_akk, 0.0)
                d_kp += left * tl.dot(level_kk, k_right, input_precision=PREC)
                down += tl.dot(tl.trans(level_kk), r_left, input_precision=PREC)
            d_km += right * down
            if DECOUPLED:
                w_right = w_s * right
                level_qw, level_kw = tl.where(pairs, d_aqw, 0.0), tl.where(pairs, d_akw, 0.0)
                d_q += left * tl.dot(level_qw, w_right, input_precision=PREC)
                d_kp += left * tl.dot(level_kw, w_right, input_precision=PREC)
                down_w = tl.dot(tl.trans(level_qw), q_left, input_precision=PREC)
                d_wm += right * (down_w + tl.dot(tl.trans(level_kw), r_left, input_precision=PREC))
        d_q += load_head_tile(dq_part, bos, length, h, row_s, col, H, K, BC, BK)
        d_km += load_head_tile(dk_minus, bos, length, h, row_s, col, H, K, BC, BK)
        if ERASE:
            d_kp += load_head_tile(dk_plus, bos, length, h, row_s, col, H, K, BC, BK)
        if READ:
            store_head_tile(dk, d_km.to(dk.dtype.element_ty), bos, length, h, row_s, col, H, K, BC, BK)
            store_head_tile(dr, d_kp, bos, length, h, row_s, col, H, K, BC, BK)
        else:
            store_head_tile(dk, (d_kp + d_km).to(dk.dtype.element_ty), bos, length, h, row_s, col, H, K, BC, BK)
        d_g = q_s * d_q + r_s * d_kp - k_s * d_km
        if DECOUPLED:
            d_wm += load_head_tile(dw_minus, bos, length, h, row_s, col, H, K, BC, BK)
            d_g -= w_s * d_wm
        if FOLD:
            tl.static_assert(DECOUPLED, "the fold needs the decoupled write key")
            partial = tl.sum(q_s * d_q - w_s * d_wm, axis=0)  # rows past the sequence are 0
            tl.store(d_log_gamma_partial + ((i * NC + s) * H + h).to(tl.int64) * K + k_idx, partial, mask=k_mask)
            g_col = tl.load(gamma + h * K + k_idx, mask=k_mask, other=1.0)[None, :]
            d_q *= g_col
            d_wm = tl.div_rn(d_wm, g_col)  # the IEEE division (plain / is the approximate one on the GPU)
        store_head_tile(dq, d_q.to(dq.dtype.element_ty), bos, length, h, row_s, col, H, K, BC, BK)
        if DECOUPLED:
            store_head_tile(dw, d_wm.to(dw.dtype.element_ty), bos, length, h, row_s, col, H, K, BC, BK)
        store_head_tile(dG, d_g, bos, length, h, row_s, col, H, K, BC, BK)
