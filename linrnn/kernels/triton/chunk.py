"""Chunkwise Triton forward and backward of the generalized recurrence (tied erase or none), as an autograd op.

The kernels and their math: ``chunk_fwd.py`` (forward) and ``chunk_bwd.py``
(backward). Every launch treats the batch as packed sequences: ``[B, T, H, D]``
inputs are viewed as ``[1, B·T, H, D]`` with ``cu_seqlens = [0, T, 2T, ...]``,
so varlen and equal lengths share one code path. Chunk ``i`` of the packed
batch is ``chunk_index[i] = (sequence, chunk in the sequence)``.

Precision: states and accumulators are fp32. Matmul operands are the input
dtype (bf16/fp16: tensor-core products, fp32 accumulation); fp32 inputs use
full-precision fp32 products (``input_precision="ieee"``), not tf32.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from linrnn.kernels.triton.chunk_bwd import (
    chunk_bwd_intra_kernel,
    chunk_bwd_main_kernel,
    chunk_bwd_wy_kernel,
    chunk_state_bwd_kernel,
)
from linrnn.kernels.triton.chunk_fwd import (
    DECAY_CHANNEL,
    DECAY_HEAD,
    DECAY_NONE,
    chunk_cumsum_kernel,
    chunk_intra_kernel,
    chunk_output_kernel,
    chunk_solve_kernel,
    chunk_state_fwd_kernel,
    chunk_wu_kernel,
)

CHUNK = 64
SUB_CHUNK = 16


def new_output(shape, dtype, device) -> Tensor:
    """Uninitialised output buffer (tests replace this to poison outputs with NaN)."""
    return torch.empty(shape, dtype=dtype, device=device)


class _Layout:
    """Packed-sequence bookkeeping shared by the forward and backward launches."""

    def __init__(self, q: Tensor, v: Tensor, g: Tensor | None, cu_seqlens: Tensor | None):
        batch, steps, self.heads, self.key_dim = q.shape
        self.value_dim = v.shape[-1]
        self.tokens = batch * steps
        device = q.device
        if cu_seqlens is None:
            lengths = torch.full((batch,), steps, dtype=torch.int64)
            self.cu_seqlens = torch.arange(0, batch + 1, dtype=torch.int32, device=device) * steps
        else:
            lengths = cu_seqlens.diff().cpu()
            self.cu_seqlens = cu_seqlens.to(torch.int32)
        counts = (lengths + CHUNK - 1) // CHUNK
        self.sequences = lengths.numel()
        self.num_chunks = int(counts.sum())
        sequence = torch.repeat_interleave(torch.arange(self.sequences), counts)
        offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        within = torch.arange(self.num_chunks) - offsets[:-1].repeat_interleave(counts)
        self.chunk_index = torch.stack([sequence, within], dim=1).to(torch.int32).to(device)
        self.chunk_offsets = offsets.to(torch.int32).to(device)
        self.decay = DECAY_NONE if g is None else (DECAY_HEAD if g.dim() == 3 else DECAY_CHANNEL)
        self.block_k = triton.next_power_of_2(self.key_dim)
        self.precision = "ieee" if q.dtype == torch.float32 else "tf32"


def chunk_forward(q, w, v, g, beta, *, erase, scale, initial_state, output_final_state, cu_seqlens):
    """Forward launches. Returns ``(o, final_state, saved)`` with what the backward needs in ``saved``."""
    layout = _Layout(q, v, g, cu_seqlens)
    H, K, V, TT, NT = layout.heads, layout.key_dim, layout.value_dim, layout.tokens, layout.num_chunks
    device, dtype = q.device, q.dtype
    common = dict(cu_seqlens=layout.cu_seqlens, chunk_index=layout.chunk_index)
    has_beta = beta is not None

    G = None
    if g is not None:
        channels = K if layout.decay == DECAY_CHANNEL else 1
        G = torch.empty(g.shape, dtype=torch.float32, device=device)
        chunk_cumsum_kernel[(NT, H)](
            g, G, None, **common, H=H, D=channels, BD=triton.next_power_of_2(channels), DE=1, BDE=1, BT=CHUNK,
            REVERSE=False, HAS_EXTRA=False,
        )  # fmt: skip

    A_qk = torch.empty(TT, H, CHUNK, dtype=torch.float32, device=device)
    A_kk = torch.empty(TT, H, CHUNK, dtype=torch.float32, device=device) if erase else None
    per_channel = layout.decay == DECAY_CHANNEL
    intra_grid = (NT, H, (CHUNK // SUB_CHUNK) ** 2 if per_channel else 1)
    chunk_intra_kernel[intra_grid](
        q, w, G, A_qk, A_kk, **common, scale=scale, H=H, K=K, BT=CHUNK, BC=SUB_CHUNK,
        BK=min(64, layout.block_k) if per_channel else min(128, layout.block_k),
        DECAY=layout.decay, ERASE=erase, PREC=layout.precision,
    )  # fmt: skip

    T = W_s = U = None
    if erase:
        T = torch.empty(TT, H, CHUNK, dtype=torch.float32, device=device)
        chunk_solve_kernel[(NT, H)](A_kk, beta, T, **common, H=H, BT=CHUNK, BC=SUB_CHUNK, HAS_BETA=has_beta,
                                    PREC=layout.precision)  # fmt: skip
        W_s = torch.empty(TT, H, K, dtype=dtype, device=device)
        U_v = torch.empty(TT, H, V, dtype=torch.float32, device=device)
        chunk_wu_kernel[(NT, H)](
            w, v, beta, G, T, W_s, U_v, **common, H=H, K=K, V=V, BT=CHUNK, BK=min(64, layout.block_k),
            BV=min(64, triton.next_power_of_2(V)), DECAY=layout.decay, HAS_BETA=has_beta, PREC=layout.precision,
        )  # fmt: skip
        U = torch.empty(TT, H, V, dtype=dtype, device=device)
    else:
        U_v = None

    states = torch.empty(NT, H, K, V, dtype=dtype, device=device)
    final = new_output((layout.sequences, H, K, V), torch.float32, device) if output_final_state else None
    block_v = _state_block_v(layout)
    chunk_state_fwd_kernel[(triton.cdiv(V, block_v), layout.sequences * H)](
        w, v, beta, G, W_s, U_v, U, states, initial_state, final, layout.cu_seqlens, layout.chunk_offsets,
        H=H, K=K, V=V, BT=CHUNK, BK=layout.block_k, BV=block_v, DECAY=layout.decay, ERASE=erase,
        HAS_BETA=has_beta, USE_INITIAL_STATE=initial_state is not None, STORE_FINAL_STATE=output_final_state,
        PREC=layout.precision,
    )  # fmt: skip
    del U_v

    o = new_output(v.shape, v.dtype, device)
    block_v = min(64, triton.next_power_of_2(V))
    chunk_output_kernel[(triton.cdiv(V, block_v), NT, H)](
        q, v, beta, G, states, U, A_qk, o, **common, scale=scale, H=H, K=K, V=V, BT=CHUNK,
        BK=min(64, layout.block_k), BV=block_v, DECAY=layout.decay, ERASE=erase, HAS_BETA=has_beta,
        PREC=layout.precision,
    )  # fmt: skip
    saved = dict(layout=layout, G=G, A_qk=A_qk, A_kk=A_kk, T=T, W_s=W_s, U=U, states=states)
    return o, final, saved


def _state_block_v(layout: _Layout) -> int:
    """Value columns per state-pass program: enough programs to fill the GPU, at most 64 columns."""
    block_v = min(64, triton.next_power_of_2(layout.value_dim))
    while block_v > 16 and layout.sequences * layout.heads * triton.cdiv(layout.value_dim, block_v) < 256:
        block_v //= 2
    return block_v


def chunk_backward(do, d_final, q, w, v, g, beta, initial_state, saved, *, erase, scale):
    """Backward launches. Returns ``(dq, dw, dv, dg, dbeta, d_initial_state)``."""
    layout: _Layout = saved["layout"]
    H, K, V, TT, NT = layout.heads, layout.key_dim, layout.value_dim, layout.tokens, layout.num_chunks
    device, dtype = q.device, q.dtype
    common = dict(cu_seqlens=layout.cu_seqlens, chunk_index=layout.chunk_index)
    has_beta, decay, precision = beta is not None, layout.decay, layout.precision
    G, states = saved["G"], saved["states"]
    do = do.contiguous()
    f32 = dict(dtype=torch.float32, device=device)

    dstates = torch.empty(NT, H, K, V, dtype=dtype, device=device)
    dU = torch.empty(TT, H, V, **f32)
    d_initial = new_output(initial_state.shape, torch.float32, device) if initial_state is not None else None
    block_v = _state_block_v(layout)
    chunk_state_bwd_kernel[(triton.cdiv(V, block_v), layout.sequences * H)](
        q, w, G, saved["W_s"], saved["A_qk"], do, dU, dstates, d_initial,
        None if d_final is None else d_final.contiguous(), layout.cu_seqlens, layout.chunk_offsets, scale,
        H=H, K=K, V=V, BT=CHUNK, BK=layout.block_k, BV=block_v, DECAY=decay, ERASE=erase,
        USE_INITIAL_STATE=initial_state is not None, USE_FINAL_GRAD=d_final is not None, PREC=precision,
    )  # fmt: skip

    dq_part, dk_minus = torch.empty(TT, H, K, **f32), torch.empty(TT, H, K, **f32)
    dW_s = torch.empty(TT, H, K, **f32) if erase else None
    dA_qk = torch.empty(TT, H, CHUNK, **f32)
    dT = torch.empty(TT, H, CHUNK, **f32) if erase else None
    dv = new_output(v.shape, v.dtype, device)
    dbeta = torch.empty(TT, H, **f32) if has_beta else None
    dG_last = torch.empty(NT, H, K, **f32) if g is not None else None
    block_k = min(64, layout.block_k)
    chunk_bwd_main_kernel[(triton.cdiv(K, block_k), NT, H)](
        w, v, beta, G, saved["T"], states, dstates, saved["U"], dU, do, dq_part, dk_minus, dW_s, dA_qk, dT, dv,
        dbeta, dG_last, **common, scale=scale, H=H, K=K, V=V, BT=CHUNK, BK=block_k,
        BV=min(64, triton.next_power_of_2(V)), DECAY=decay, ERASE=erase, HAS_BETA=has_beta, PREC=precision,
    )  # fmt: skip
    del dstates, dU

    dk_plus = dA_kk = None
    if erase:
        dk_plus, dA_kk = torch.empty(TT, H, K, **f32), torch.empty(TT, H, CHUNK, **f32)
        chunk_bwd_wy_kernel[(NT, H)](
            w, beta, G, saved["T"], saved["A_kk"], dW_s, dT, dbeta, dk_plus, dA_kk, **common,
            H=H, K=K, BT=CHUNK, BK=block_k, DECAY=decay, HAS_BETA=has_beta, PREC=precision,
        )  # fmt: skip

    dq, dw = new_output(q.shape, q.dtype, device), new_output(w.shape, w.dtype, device)
    dG = torch.empty(g.shape, **f32) if g is not None else None
    per_channel = decay == DECAY_CHANNEL
    intra_block_k = block_k if per_channel else min(128, layout.block_k)
    grid = (NT, H, (CHUNK // SUB_CHUNK) * triton.cdiv(K, intra_block_k) if per_channel else 1)
    chunk_bwd_intra_kernel[grid](
        q, w, G, dA_qk, dA_kk, dq_part, dk_minus, dk_plus, dq, dw, dG, **common,
        H=H, K=K, BT=CHUNK, BC=SUB_CHUNK, BK=intra_block_k, DECAY=decay, ERASE=erase, PREC=precision,
    )  # fmt: skip

    dg = None
    if g is not None:
        channels = K if per_channel else 1
        dg = new_output(g.shape, g.dtype, device)
        chunk_cumsum_kernel[(NT, H)](
            dG, dg, dG_last, **common, H=H, D=channels, BD=triton.next_power_of_2(channels), DE=K,
            BDE=layout.block_k, BT=CHUNK, REVERSE=True, HAS_EXTRA=True,
        )  # fmt: skip
    if dbeta is not None:
        dbeta = dbeta.to(beta.dtype).view(beta.shape)
    return dq, dw, dv, dg, dbeta, d_initial


class ChunkRecurrence(torch.autograd.Function):
    """The recurrence with a tied erase (``erase=True``: e = w) or none, Triton forward and backward."""

    @staticmethod
    def forward(ctx, q, w, v, g, beta, initial_state, erase, scale, output_final_state, cu_seqlens):
        q, w, v = q.contiguous(), w.contiguous(), v.contiguous()
        g = None if g is None else g.contiguous()
        beta = None if beta is None else beta.contiguous()
        initial_state = None if initial_state is None else initial_state.contiguous()
        o, final, saved = chunk_forward(
            q, w, v, g, beta, erase=erase, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        )  # fmt: skip
        names = ["G", "A_qk", "A_kk", "T", "W_s", "U", "states"]
        ctx.save_for_backward(q, w, v, g, beta, initial_state, *(saved[n] for n in names))
        ctx.names, ctx.layout, ctx.erase, ctx.scale = names, saved["layout"], erase, scale
        return o, final

    @staticmethod
    def backward(ctx, do, d_final):
        q, w, v, g, beta, initial_state, *buffers = ctx.saved_tensors
        saved = dict(zip(ctx.names, buffers), layout=ctx.layout)
        dq, dw, dv, dg, dbeta, d_initial = chunk_backward(
            do, d_final, q, w, v, g, beta, initial_state, saved, erase=ctx.erase, scale=ctx.scale
        )
        if d_initial is not None:
            d_initial = d_initial.to(initial_state.dtype)
        return dq, dw, dv, dg, dbeta, d_initial, None, None, None, None


def chunk_recurrence(q, w, v, e, g, beta, *, scale, initial_state=None, output_final_state=False, cu_seqlens=None):
    """Same arguments and results as ``recurrence_reference`` for ``e is w`` (tied) or ``e is None``, with
    autograd. Inputs must be validated already (``ops`` does); K and V up to 256."""
    if e is not None and e is not w:
        raise NotImplementedError("chunk_recurrence: a decoupled erase direction (e is not w) is not supported yet")
    return ChunkRecurrence.apply(q, w, v, g, beta, initial_state, e is not None, scale, output_final_state,
                                 cu_seqlens)  # fmt: skip
