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

    def buffer(self, *shape, dtype=torch.float32, device=None) -> Tensor:
        return torch.empty(shape, dtype=dtype, device=device)


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
