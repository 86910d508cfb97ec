"""Chunkwise form of the generalized recurrence in plain torch (differentiable by autograd).

Recurrence (see ``reference.py``)::

    S_t = (I − β_t e_t r_tᵀ) Diag(α_t) S_{t−1} + β_t w_t v_tᵀ,   α_t = exp(g_t),   r_t = b_t ⊙ e_t

Split time into chunks of C steps. Inside a chunk let ``Γ_r = ∏_{i≤r} α_i``
(cumulative decay from the chunk start, per channel or per head) and define
the erased content ``u_r = −β_r S_{r−1}ᵀ Diag(α_r) r_r`` so that
``S_r = Diag(α_r) S_{r−1} + e_r u_rᵀ + β_r w_r v_rᵀ``. Unrolling from the chunk
start state ``S_0``::

    S_r = Diag(Γ_r) S_0 + Σ_{i≤r} Diag(Γ_r/Γ_i) (e_i u_iᵀ + β_i w_i v_iᵀ)

Substituting into the definition of u_r gives a unit lower-triangular system,
with ``A_xy[r, i] = (x_r ⊙ Γ_r/Γ_i)·y_i``::

    (I + Diag(β) A_re) U = −Diag(β) [ (R ⊙ Γ) S_0 + A_rw Diag(β) V ]        (i < r)
    O   = (Q ⊙ Γ) S_0 + A_qe U + A_qw Diag(β) V                             (i ≤ r)
    S_C = Diag(Γ_C) S_0 + (E ⊙ Γ_C/Γ)ᵀ U + (W ⊙ Γ_C/Γ)ᵀ Diag(β) V

With a tied erase (e = w = k) the write folds into the erased content: ``U' = U + Diag(β) V``
solves ``(I + Diag(β) A_rk) U' = Diag(β) (V − (R ⊙ Γ) S_0)`` and then
``O = (Q ⊙ Γ) S_0 + A_qk U'``, ``S_C = Diag(Γ_C) S_0 + (K ⊙ Γ_C/Γ)ᵀ U'`` (the WY/UT form of
DeltaNet/GDN/KDA), three fewer matmuls per chunk.

U is affine in S_0: ``U = U_v − W_s S_0`` with ``U_v``, ``W_s`` solved for all
chunks at once, so the only sequential part is the chunk-to-chunk state pass,
two small matmuls per chunk. Outputs are then computed for all chunks at once.

Numerics: the pairwise ratios Γ_r/Γ_i are formed as ``exp(G_r − G_i)`` with
``G = cumsum(g)`` and the exponent masked to ``i ≤ r`` *before* ``exp``, so every
factor lies in [0, 1] and nothing overflows for any gate (log-decay −20 per
step included). Per-channel decay would make that tensor ``[C, C, K]`` per
chunk; ``_pairwise_products`` keeps it exact only inside sub-blocks and factors
the rest through a reference point between the blocks (still no factor > 1). Everything
is computed in fp32 (fp64 for fp64 inputs); outputs return in ``v``'s dtype.

Sequences shorter than a chunk multiple, and varlen (``cu_seqlens``) batches,
are packed into a zero-padded ``[N, L, H, D]`` batch: a padded step has
g = 0, β = 0 and zero vectors, so it is the identity and leaves the final
state untouched.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from einops import rearrange
from torch import Tensor

from linrnn.kernels.reference import compute_dtype

DEFAULT_CHUNK = 32  # fastest on CPU for every decay kind at T = 2048, K = V = 64 (benchmarks/RESULTS.md)
SUB_CHUNK = 4  # per-channel decay: exact pairwise ratios only inside sub-blocks (4: fastest on CPU)


def recurrence_chunked(
    q: Tensor,
    w: Tensor,
    v: Tensor,
    e: Tensor | None = None,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    *,
    erase_gate: Tensor | None = None,
    scale: float,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    chunk_size: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunkwise evaluation of ``recurrence_reference`` (same arguments, same results).

    ``e is w`` (the same tensor) marks the tied case and shares the pairwise products. ``erase_gate`` b: the
    erase reads the state along ``r = b ⊙ e`` instead of e (module docstring).
    """
    dtype, out_dtype = compute_dtype(q.dtype), v.dtype
    tied = e is w
    steps = q.shape[1]
    longest = steps if cu_seqlens is None else int(cu_seqlens.diff().max())
    chunk_size = max(1, min(chunk_size or DEFAULT_CHUNK, longest))  # one decode step needs no padded chunk
    packer = _Packer(cu_seqlens, steps=steps, chunk_size=chunk_size, device=q.device)

    def pack(x: Tensor | None) -> Tensor | None:
        if x is None:
            return None
        x = packer.pack(x.to(dtype))  # [N, L, H, ...]
        if x.dim() == 3:
            return rearrange(x, "n (c r) h -> n h c r", r=chunk_size)
        return rearrange(x, "n (c r) h d -> n h c r d", r=chunk_size)

    q, w, v, g, beta = (pack(x) for x in (q, w, v, g, beta))
    e = w if tied else pack(e)
    read = e if erase_gate is None else e * pack(erase_gate)
    state = None if initial_state is None else initial_state.to(dtype)
    o, final = _chunk_recurrence(q * scale, w, v, e, g, beta, state, tied, read)
    o = packer.unpack(rearrange(o, "n h c r d -> n (c r) h d"))
    return o.to(out_dtype), final if output_final_state else None


class _Packer:
    """Moves ``[B, T, H, ...]`` to a zero-padded ``[N, L, H, ...]`` batch (L a chunk multiple) and back."""

    def __init__(self, cu_seqlens: Tensor | None, *, steps: int, chunk_size: int, device: torch.device):
        self.steps = steps
        if cu_seqlens is None:
            self.index = None
            self.length = max(1, -(-steps // chunk_size)) * chunk_size
            return
        bounds = cu_seqlens.tolist()
        starts = torch.tensor(bounds[:-1], device=device)
        lengths = torch.tensor(bounds[1:], device=device) - starts
        longest = max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True))
        self.length = max(1, -(-longest // chunk_size)) * chunk_size
        offsets = torch.arange(self.length, device=device)
        self.valid = offsets[None, :] < lengths[:, None]  # [N, L]
        self.index = (starts[:, None] + offsets[None, :]).clamp(max=steps - 1)

    def pack(self, x: Tensor) -> Tensor:
        if self.index is None:
            pad = [0, 0] * (x.dim() - 2) + [0, self.length - self.steps]
            return F.pad(x, pad)
        mask = self.valid.view(*self.valid.shape, *[1] * (x.dim() - 2))
        return x[0, self.index] * mask

    def unpack(self, x: Tensor) -> Tensor:
        if self.index is None:
            return x[:, : self.steps]
        return x[self.valid].unsqueeze(0)


def _chunk_recurrence(q, w, v, e, g, beta, state, tied, read=None):
    """Core on chunked tensors: q, w, e ``[N, H, n, C, K]``, v ``[N, H, n, C, V]``,
    g ``[N, H, n, C]`` (per head) or ``[N, H, n, C, K]`` (per channel), beta ``[N, H, n, C]``; ``read``
    ``[N, H, n, C, K]``: the vector the erase reads the state with (e unless gated).
    ``q`` is already scaled. Returns o ``[N, H, n, C, V]`` and the final state ``[N, H, K, V]``.
    """
    batch, heads, num_chunks, chunk, key_dim = q.shape
    value_dim = v.shape[-1]
    strictly_causal = torch.ones(chunk, chunk, dtype=torch.bool, device=q.device).tril(-1)
    per_channel = g is not None and g.dim() == 5

    if g is None:
        log_decay = decay_from_start = decay_to_end = decay_chunk = None
    else:
        log_decay = g.cumsum(dim=3)  # G_r, [N, H, n, C(, K)]
        log_last = log_decay[:, :, :, -1:]
        decay_from_start = _as_channel(log_decay.exp(), per_channel)  # Γ_r
        decay_to_end = _as_channel((log_last - log_decay).exp(), per_channel)  # Γ_C / Γ_r
        decay_chunk = _as_channel(log_last.exp(), per_channel)[:, :, :, 0]  # Γ_C, [N, H, n, K|1]
    pairwise = _pairwise_products(log_decay, per_channel, chunk, q.dtype, q.device)

    def scaled(x: Tensor, factor: Tensor | None) -> Tensor:
        return x if factor is None else x * factor

    strength = torch.ones_like(v[..., 0]) if beta is None else beta  # [N, H, n, C]
    weighted_v = strength[..., None] * v  # Diag(β) V
    attn_qw = pairwise(q, w)
    # Tied erase (e = w) folds the write into the erased content (U' = U + Diag(β) V, the WY/UT form);
    # otherwise the write enters the state and the output through its own terms.
    out_intra = None if tied else attn_qw @ weighted_v
    write_to_end = None if tied else scaled(w, decay_to_end).transpose(-1, -2) @ weighted_v  # [N, H, n, K, V]

    if e is not None:
        read = e if read is None else read
        attn_re = pairwise(read, e) * strictly_causal
        attn_qe = attn_qw if tied else pairwise(q, e)
        rhs_values = weighted_v if tied else -strength[..., None] * ((pairwise(read, w) * strictly_causal) @ weighted_v)
        system = torch.eye(chunk, dtype=q.dtype, device=q.device) + strength[..., None] * attn_re
        rhs = torch.cat([rhs_values, strength[..., None] * scaled(read, decay_from_start)], dim=-1)
        solution = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
        erased_from_values, erased_per_state = solution.split([value_dim, key_dim], dim=-1)
        erase_to_end = scaled(e, decay_to_end).transpose(-1, -2)  # [N, H, n, K, C]

    if state is None:
        state = q.new_zeros(batch, heads, key_dim, value_dim)

    def per_chunk(x: Tensor | None) -> list:
        # Unbind once: indexing x[:, :, c] in the loop would make each backward step fill a full-size zero grad.
        return [None] * num_chunks if x is None else x.unbind(2)

    decays, writes = per_chunk(decay_chunk), per_chunk(write_to_end)
    if e is not None:
        from_values, per_state, to_end = (x.unbind(2) for x in (erased_from_values, erased_per_state, erase_to_end))
    start_states, erased = [], []
    for c in range(num_chunks):
        start_states.append(state)
        new_state = state if decays[c] is None else decays[c][..., None] * state
        if e is not None:
            erased.append(from_values[c] - per_state[c] @ state)  # U (U' when tied), [N, H, C, V]
            new_state = new_state + to_end[c] @ erased[c]
        state = new_state if writes[c] is None else new_state + writes[c]
    start_states = torch.stack(start_states, dim=2)  # [N, H, n, K, V]

    out = scaled(q, decay_from_start) @ start_states
    if out_intra is not None:
        out = out + out_intra
    if e is not None:
        out = out + attn_qe @ torch.stack(erased, dim=2)
    return out, state


def _pairwise_products(log_decay, per_channel, chunk, dtype, device):
    """A function ``(x, y) -> [.., C, C]`` with entry (r, i) = (x_r ⊙ Γ_r/Γ_i)·y_i for i ≤ r, else 0.

    Per-head (or no) decay: one matmul times the masked ``exp(G_r − G_i)``. Per-channel decay splits the
    chunk into sub-blocks of ``SUB_CHUNK``: a diagonal block keeps the exact ``[c, c, K]`` ratios; an
    off-diagonal block (rows in sub-block a, columns before it) factors the ratio at ``G_ref``, the
    log-decay at the end of sub-block a − 1, as ``exp(G_r − G_ref) · exp(G_ref − G_i)``: both exponents
    are ≤ 0, so neither factor overflows, and the product is a plain matmul.
    """
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=device).tril()
    if log_decay is None:
        mask = causal.to(dtype)
        return lambda x, y: (x @ y.transpose(-1, -2)) * mask
    if not per_channel:
        diff = log_decay[..., :, None] - log_decay[..., None, :]  # [.., C, C]
        ratio = torch.where(causal, diff, float("-inf")).exp()  # masked before exp: every factor in [0, 1]
        return lambda x, y: (x @ y.transpose(-1, -2)) * ratio

    sub = SUB_CHUNK if chunk % SUB_CHUNK == 0 else chunk
    blocks = log_decay.unflatten(-2, (chunk // sub, sub))  # [.., m, c, K]
    local_causal = causal[:sub, :sub, None]
    diagonal = torch.where(local_causal, blocks[..., :, None, :] - blocks[..., None, :, :], float("-inf")).exp()
    reference = blocks[..., :-1, -1, :]  # G_ref for row blocks 1..m−1, [.., m − 1, K]
    left = (blocks[..., 1:, :, :] - reference[..., None, :]).exp()  # [.., m − 1, c, K]
    block_starts = torch.arange(sub, chunk, sub, device=device)
    before = torch.arange(chunk, device=device)[None, :] < block_starts[:, None]  # [m − 1, C]
    right = torch.where(before[..., None], reference[..., None, :] - log_decay[..., None, :, :], float("-inf")).exp()
    identity = torch.eye(chunk // sub, dtype=dtype, device=device)

    def products(x: Tensor, y: Tensor) -> Tensor:
        x_blocks, y_blocks = x.unflatten(-2, (chunk // sub, sub)), y.unflatten(-2, (chunk // sub, sub))
        within = torch.einsum("...ark,...aik,...arik->...ari", x_blocks, y_blocks, diagonal)  # [.., m, c, c]
        out = torch.einsum("...ari,ab->...arbi", within, identity).flatten(-2)  # block diagonal, [.., m, c, C]
        if chunk > sub:
            across = (x_blocks[..., 1:, :, :] * left) @ (y[..., None, :, :] * right).transpose(-1, -2)
            out = out + F.pad(across, (0, 0, 0, 0, 1, 0))  # row block 0 has nothing before it
        return out.flatten(-3, -2)

    return products


def _as_channel(x: Tensor, per_channel: bool) -> Tensor:
    """Per-head factors ``[.., C]`` get a trailing axis to broadcast over K."""
    return x if per_channel else x[..., None]
