"""Fused recurrent Triton kernel for the generalized recurrence: forward only (inference and decoding).

One program owns one (sequence, head, block of BV value columns) and keeps its
``[K, BV]`` slice of the state in registers for the whole sequence, so the state
touches memory only at the start (``initial_state``) and the end (final state)::

    S ← Diag(exp g_t) S;  S ← S − β_t e_t (r_tᵀ S);  S ← S + β_t w_t v_tᵀ;  o_t = Sᵀ (scale · q_t)

with the read vector ``r_t = b_t ⊙ e_t`` under an erase gate b, else ``e_t``,

which is the update of ``reference.py`` step by step. The decay kind (none, per
head, per channel), the erase term, the write strength and varlen are
compile-time flags, so one kernel serves every cell. Arithmetic is fp32 for
any input dtype; each step reads its q, w, e, v once. It has no backward:
training goes through the chunkwise path.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from linrnn.kernels import heads_dense, to_device
from linrnn.kernels.triton import cdiv, new_output, next_power_of_2

DECAY_NONE, DECAY_HEAD, DECAY_CHANNEL = 0, 1, 2
MANY_PROGRAMS = 2048  # programs of 16 value columns beyond which wider blocks are faster


@triton.jit
def _fused_recurrent_fwd_kernel(
    q, w, v, e, g, beta, erase_gate, log_gamma, initial_state, o, final_state, cu_seqlens,
    scale, steps, q_row, w_row, v_row, e_row,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    DECAY: tl.constexpr, ERASE: tl.constexpr, HAS_BETA: tl.constexpr, HAS_ERASE_GATE: tl.constexpr,
    HAS_GAMMA: tl.constexpr,
    USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    seq_head, block_v = tl.program_id(0), tl.program_id(1)  # sequences x heads on axis 0: it allows 2^31 - 1
    n, h = seq_head // H, seq_head % H
    if IS_VARLEN:
        start, end = tl.load(cu_seqlens + n).to(tl.int64), tl.load(cu_seqlens + n + 1).to(tl.int64)
    else:
        start, end = n.to(tl.int64) * steps, n.to(tl.int64) * steps + steps
    k_idx = tl.arange(0, BK)
    v_idx = block_v * BV + tl.arange(0, BV)
    k_mask, v_mask = k_idx < K, v_idx < V
    tile_mask = k_mask[:, None] & v_mask[None, :]
    state_offsets = (n * H + h).to(tl.int64) * K * V + k_idx[:, None] * V + v_idx[None, :]

    if HAS_GAMMA:  # GammaNet's fold, in registers: the loop runs on Γ⁻¹S with query Γq and write key Γ⁻¹k
        gamma = tl.exp(tl.load(log_gamma + h * K + k_idx, mask=k_mask, other=0).to(tl.float32))
    state = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_INITIAL_STATE:
        state += tl.load(initial_state + state_offsets, mask=tile_mask, other=0).to(tl.float32)
        if HAS_GAMMA:
            state /= gamma[:, None]
    for t in range(start, end):
        row = t * H + h  # token t, head h in the flattened [B * T, H] layout (g, beta, o)
        if DECAY == 1:
            state *= tl.exp(tl.load(g + row).to(tl.float32))
        if DECAY == 2:
            state *= tl.exp(tl.load(g + row * K + k_idx, mask=k_mask, other=0).to(tl.float32))[:, None]
        strength = tl.load(beta + row).to(tl.float32) if HAS_BETA else 1.0
        if ERASE:
            e_t = tl.load(e + t * e_row + h * K + k_idx, mask=k_mask, other=0).to(tl.float32)
            r_t = e_t
            if HAS_ERASE_GATE:  # contiguous [B·T, H, K]
                r_t *= tl.load(erase_gate + row * K + k_idx, mask=k_mask, other=0).to(tl.float32)
            recalled = tl.sum(r_t[:, None] * state, axis=0)  # rᵀS, [BV]
            state -= strength * e_t[:, None] * recalled[None, :]
        w_t = tl.load(w + t * w_row + h * K + k_idx, mask=k_mask, other=0).to(tl.float32)
        if HAS_GAMMA:
            w_t /= gamma
        v_t = tl.load(v + t * v_row + h * V + v_idx, mask=v_mask, other=0).to(tl.float32)
        state += (strength * w_t)[:, None] * v_t[None, :]
        q_t = tl.load(q + t * q_row + h * K + k_idx, mask=k_mask, other=0).to(tl.float32) * scale
        if HAS_GAMMA:
            q_t *= gamma
        tl.store(o + row * V + v_idx, tl.sum(q_t[:, None] * state, axis=0).to(o.dtype.element_ty), mask=v_mask)
    if STORE_FINAL_STATE:
        if HAS_GAMMA:
            state *= gamma[:, None]
        if final_state.dtype.element_ty == tl.bfloat16:  # a bf16 decoding state: round to nearest even
            state = _round_to_bfloat16(state)
        tl.store(final_state + state_offsets, state.to(final_state.dtype.element_ty), mask=tile_mask)


@triton.jit
def _round_to_bfloat16(x):
    """fp32 ``x`` rounded to the nearest bf16 value (ties to even), still fp32: its cast to bf16 is then exact. The
    cast alone rounds to nearest on the GPU but truncates under the Triton interpreter."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


def fused_recurrent_fwd(
    q: Tensor,
    w: Tensor,
    v: Tensor,
    e: Tensor | None = None,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    *,
    erase_gate: Tensor | None = None,
    log_gamma: Tensor | None = None,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    final_state: Tensor | None = None,
    block_v: int | None = None,
    num_warps: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Same arguments and results as ``recurrence_reference`` (forward only, no autograd).

    ``erase_gate`` b ``[B, T, H, K]``: the erase reads the state along ``b ⊙ e``. ``log_gamma`` ``[H, K]`` runs
    GammaNet: the erase ``e`` and the true state in and out, with Γ folded inside the kernel (see ``ops.gammanet``).
    Inputs must be validated already (``ops`` does); K and V up to 256. Outputs: o in ``v``'s dtype, final state
    fp32. ``block_v`` (value columns per program) and ``num_warps`` override the launch shape
    (benchmarks/tune_fused_recurrent.py).
    ``final_state``: a contiguous fp32 or bf16 ``[N, H, K, V]`` buffer to write the final state into (rounded once,
    at the end); it may be ``initial_state`` itself (each program loads its tile before it stores it).
    """
    batch, steps, heads, key_dim = q.shape
    value_dim = v.shape[-1]
    sequences = batch if cu_seqlens is None else cu_seqlens.numel() - 1
    cu_seqlens = None if cu_seqlens is None else to_device(cu_seqlens, q.device)
    q, w, v = (heads_dense(x) for x in (q, w, v))  # column slices of the mixers' short-conv output: read in place
    e = None if e is None else heads_dense(e)
    o = new_output((batch, steps, heads, value_dim), v.dtype, v.device)
    final = final_state
    if final is None and output_final_state:
        final = new_output((sequences, heads, key_dim, value_dim), torch.float32, v.device)
    decay = DECAY_NONE if g is None else (DECAY_HEAD if g.dim() == 3 else DECAY_CHANNEL)
    block_k = next_power_of_2(key_dim)
    # few sequences (decoding a handful of slots): 16 columns x 1 warp; many: 64 x 4 warps, which reads each state
    # row in longer runs (H200, 340M shapes: 110 against 228 µs at 256 slots; benchmarks/RESULTS.md)
    many = sequences * heads * cdiv(value_dim, 16) > MANY_PROGRAMS
    block_v = block_v or min(64 if many else 16, next_power_of_2(value_dim))
    num_warps = num_warps or (4 if many else 1)
    grid = (sequences * heads, cdiv(value_dim, block_v))
    _fused_recurrent_fwd_kernel[grid](
        q, w, v, e, None if g is None else g.contiguous(), None if beta is None else beta.contiguous(),
        None if erase_gate is None else erase_gate.contiguous(), None if log_gamma is None else log_gamma.contiguous(),
        None if initial_state is None else initial_state.contiguous(), o, final, cu_seqlens,
        scale, steps, q.stride(1), w.stride(1), v.stride(1), 0 if e is None else e.stride(1),
        H=heads, K=key_dim, V=value_dim, BK=block_k, BV=block_v,
        DECAY=decay, ERASE=e is not None, HAS_BETA=beta is not None, HAS_ERASE_GATE=erase_gate is not None,
        HAS_GAMMA=log_gamma is not None,
        USE_INITIAL_STATE=initial_state is not None, STORE_FINAL_STATE=final is not None,
        IS_VARLEN=cu_seqlens is not None,
        num_warps=num_warps,
    )  # fmt: skip
    return o, final
