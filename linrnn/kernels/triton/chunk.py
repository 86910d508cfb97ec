"""Chunkwise Triton forward and backward launches of the generalized recurrence (autograd: ``kernels/library.py``).

The kernels and their math: ``chunk_fwd.py`` (forward) and ``chunk_bwd.py``
(backward). Every launch treats the batch as packed sequences: ``[B, T, H, D]``
inputs are viewed as ``[1, B·T, H, D]``. Chunk ``i`` of the packed batch is
``chunk_index[i] = (sequence, chunk in the sequence)`` for varlen; for equal
lengths the launches pass ``cu_seqlens = T`` and ``chunk_index = None`` and the
kernels compute it (``chunk_fwd._chunk_bounds``).

Precision: states and accumulators are fp32. Matmul operands are the input
dtype (bf16/fp16: tensor-core products, fp32 accumulation); fp32 inputs use
fp32-accurate products (``input_precision="tf32x3"``), not plain tf32.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from linrnn.kernels import TRITON_CHUNK as CHUNK
from linrnn.kernels import to_device
from linrnn.kernels.triton import cdiv, new_output, next_power_of_2
from linrnn.kernels.triton.chunk_bwd import (
    chunk_bwd_fused_kernel,
    chunk_bwd_intra_kernel,
    chunk_bwd_local_du_kernel,
    chunk_bwd_local_kernel,
    chunk_bwd_main_kernel,
    chunk_state_bwd_kernel,
)
from linrnn.kernels.triton.chunk_fwd import (
    DECAY_CHANNEL,
    DECAY_HEAD,
    DECAY_NONE,
    chunk_cumsum_kernel,
    chunk_intra_kernel,
    chunk_output_kernel,
    chunk_solve_wu_kernel,
    chunk_state_fwd_kernel,
)

SUB_CHUNK = 16
MAX_BLOCK = 256  # K up to 256: the state kernels hold all of K
STATE_BLOCK_V = {64: 64, 128: 64, 256: 16}  # key width -> most value columns per state-pass program
# 256 halved the state columns at 2×16384 and doubled the backward state pass; 64 rather than 128 (64 columns, not
# 32, at 4×4096 with H = 6, K = 128, V = 256) took the state passes of KDA from 267 + 620 µs to 267 + 341 and of
# GammaNet from 501 + 846 to 334 + 532 (H200)
STATE_MIN_PROGRAMS = 64
# warps per program, by kernel (chosen by timing on an H100, B×T = 8×4096, H = 16, K = V = 128, bf16): 8 where
# [64, 64] fp32 tiles spill out of registers with 4; 1 for the 16 × 16 block solve, whose row-by-row substitution is
# cross-thread reductions (2.9× faster than with 4 warps); 8 for intra with per-head decay (0.32 -> 0.20 ms), not
# without decay: there 8 warps gave a wrong A_kk for bf16 at K = 128 (triton 3.6, H100) and no speed-up.
# "<kernel>_decoupled": a decoupled write key's launch (GammaNet), timed at the 340M model's shapes (4×4096 and
# 1×16384, H = 6, K = 128, V = 256, H200, experiments/tune_chunk.py): the solve with 2 warps (its extra P V product)
# 276 -> 204 µs, where the tied one takes 96 with 1 and 148 with 2; the main backward kernel 265 -> 203 µs with 4
# warps tied (KDA), 330 -> 372 decoupled. The output kernel with 8 (GDN, H200): 292 -> 274 µs at 8×4096 H = 16,
# 103 -> 97 at the 340M shapes (on an H100 the earlier kernel, storing A_qk in fp32, went 362 -> 445 at 8×4096 and
# 118 -> 113 at the 340M shapes with 8: not yet retimed there)
WARPS = dict(intra=4, intra_head=8, intra_channel=2, solve_wu=1, solve_wu_decoupled=2, state_fwd=4, output=8,
             state_bwd=8, main=4, main_decoupled=8, local=8, bwd_intra=4, bwd_intra_channel=2, fused=8,
             local_du=4)  # fmt: skip
# value columns per output-kernel program (each program reads the chunk's q, and k for A_qk, whole)
OUTPUT_BLOCK_V = 128
# tied erase with no or per-head decay (DeltaNet, GDN): one backward kernel after the state pass, up to this K
FUSED_MAX_K = 128
FUSED_BLOCK_V = 32
# key and value columns per step of the solve kernel's W_s and U_v products (in one warp: registers)
SOLVE_WU_BLOCK = 32
# key columns per step of the solve kernel's A_kk product on the fused path
SOLVE_KK_BLOCK = 64
# the backward state pass's chunk-local term (A_qkᵀ dO) from a parallel kernel first, so the sequential
# loop does one product fewer per chunk: True, False, or None (by length: when the sequences average at least
# LOCAL_FIRST_MIN_CHUNKS chunks). At the 340M shapes (H = 6, K = 128, V = 256, H200) it took 4.9% off GDN's and
# KDA's and 1.9% off GammaNet's chunk fwd+bwd at 1×16384 (256 chunks), and added 1.4-3.5% at 4×4096 (64 chunks)
STATE_BWD_LOCAL_FIRST: bool | None = None
LOCAL_FIRST_MIN_CHUNKS = 128
# software pipelining depth of 16-bit inputs, (state passes, other kernels), up to K = 128 and past it
STAGES_16BIT = [(2, 3), (1, 2)]
# kernels that run faster with another depth for 16-bit inputs: the output kernel 210 -> 172 µs with 2 (GammaNet,
# 4×4096, H = 6, K = 128, V = 256, H200), where the backward's main and local kernels lose 15% with 2
KERNEL_STAGES_16BIT = dict(output=2)
# kernels that hold more tiles with a decoupled write key, run one stage shallower then: the local backward kernel
# (dX from the [BT, K] write keys and [K, BV] tiles of dS') needs 254 KB of shared memory at K = 128 with 3 stages
# and 262 KB at K = 256 with 2; an sm_90 block has 227 KB
SHALLOWER_DECOUPLED = {"local"}


def _chunk_index(lengths: Tensor, device) -> tuple[int, int, Tensor, Tensor]:
    """Sequences, chunks, ``chunk_index`` ``[NT, 2]`` (sequence, chunk in it) and each sequence's first chunk
    ``[N + 1]`` (int32, on ``device``) for sequence ``lengths`` (int64, on the CPU)."""
    counts = (lengths + CHUNK - 1) // CHUNK
    num_chunks = int(counts.sum())
    sequence = torch.repeat_interleave(torch.arange(lengths.numel()), counts)
    offsets = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
    within = torch.arange(num_chunks) - offsets[:-1].repeat_interleave(counts)
    index = torch.stack([sequence, within], dim=1).to(torch.int32)
    return lengths.numel(), num_chunks, to_device(index, device), to_device(offsets.to(torch.int32), device)


@functools.lru_cache(maxsize=8)
def _varlen_index(bounds: tuple[int, ...], device: torch.device) -> tuple[Tensor, int, int, Tensor, Tensor]:
    """``cu_seqlens`` (int32), sequences, chunks, ``chunk_index`` and ``chunk_offsets`` on ``device`` for the
    sequence boundaries ``bounds``, cached by value: a model's layers, forward and backward, pass one step's packed
    documents to every op call, and the index is built on the host and copied once per step, not once per call."""
    cu_seqlens = torch.tensor(bounds, dtype=torch.int64)
    sequences, num_chunks, index, offsets = _chunk_index(cu_seqlens.diff(), device)
    return to_device(cu_seqlens.to(torch.int32), device), sequences, num_chunks, index, offsets


class _Layout:
    """Packed-sequence bookkeeping shared by the forward and backward launches."""

    def __init__(self, q: Tensor, v: Tensor, g: Tensor | None, cu_seqlens: Tensor | None, fp32_accurate: bool,
                 decoupled: bool):  # fmt: skip
        batch, steps, self.heads, self.key_dim = q.shape
        self.decoupled = decoupled
        self.value_dim = v.shape[-1]
        self.tokens = batch * steps
        if cu_seqlens is None:  # equal lengths: the kernels take the length for cu_seqlens, and no index tensors
            self.sequences, self.num_chunks = batch, batch * cdiv(steps, CHUNK)
            self.cu_seqlens, self.chunk_index, self.chunk_offsets = steps, None, None
        else:  # the grids need the number of chunks: a device sync unless cu_seqlens is on the CPU (as models pass it)
            bounds = tuple(cu_seqlens.tolist())
            self.cu_seqlens, self.sequences, self.num_chunks, self.chunk_index, self.chunk_offsets = _varlen_index(
                bounds, q.device
            )
        self.state_rows = state_rows(batch, steps, None if cu_seqlens is None else cu_seqlens.numel() - 1)
        decay = DECAY_NONE if g is None else (DECAY_HEAD if g.dim() == 3 else DECAY_CHANNEL)
        self.decay = decay.value  # a plain int for the launches
        self.block_k = _block(self.key_dim, MAX_BLOCK)
        # fp32 products as three tf32 ones (fp32 accuracy): "ieee" gave wrong gradients at K >= 100 on H200
        # with triton 3.6 (the same kernels pass with tf32, at tf32 accuracy)
        self.precision = "tf32x3" if q.dtype == torch.float32 and fp32_accurate else "tf32"
        self.half = q.dtype != torch.float32
        # software pipelining depth, within shared memory up to K = V = 256: fp32 tiles take twice the space
        if q.dtype == torch.float32:
            self.state_stages = self.stages = 1
        else:
            # past K = 128 the per-channel state passes need over 228 KB of shared memory with 2 stages
            self.state_stages, self.stages = STAGES_16BIT[0 if self.key_dim <= 128 else 1]

    def warps(self, kernel: str) -> int:
        """``WARPS[kernel]`` (``WARPS[kernel + "_decoupled"]`` where there is one and the write key is decoupled)
        for 16-bit inputs with K, V ≥ 64, else at most 4. With 8 warps the backward's fused and local kernels made
        illegal memory accesses on an H200 with triton 3.6, for fp32 inputs at every K and for bf16 at
        K = V = 16, while 4 warps and the interpreter were correct."""
        warps = WARPS.get(f"{kernel}_decoupled", WARPS[kernel]) if self.decoupled else WARPS[kernel]
        if self.half and min(self.key_dim, self.value_dim) >= 64:
            return warps
        return min(warps, 4)

    def stages_of(self, kernel: str) -> int:
        """Software pipelining depth of a parallel kernel: ``KERNEL_STAGES_16BIT`` for 16-bit inputs, else the
        common depth; one less for ``SHALLOWER_DECOUPLED`` with a decoupled write key (at least 1)."""
        stages = KERNEL_STAGES_16BIT.get(kernel, self.stages) if self.half else self.stages
        return max(1, stages - 1) if self.decoupled and kernel in SHALLOWER_DECOUPLED else stages


def value_rows(v: Tensor) -> Tensor:
    """The values ``[B, T, H, V]`` as the kernels read them: v itself when its tokens lie evenly spaced with each
    token's heads contiguous (a column block of wider rows, such as the values' columns of the short convolution's
    output: read in place, no copy), else a contiguous copy."""
    batch, steps, heads, dim = v.shape
    stride = v.stride()
    in_place = (steps > 1 and (dim == 1 or stride[3] == 1) and (heads == 1 or stride[2] == dim)
                and (batch == 1 or stride[0] == steps * stride[1]) and stride[1] >= heads * dim)  # fmt: skip
    return v if v.is_contiguous() or in_place else v.contiguous()


def _token_stride(v: Tensor) -> int:
    """Elements between v's tokens, for ``value_rows(v)``."""
    if v.is_contiguous():
        return v.shape[2] * v.shape[3]
    if value_rows(v) is not v:
        raise ValueError("chunk kernels: argument 'v' must be contiguous or read in place (value_rows); got strides "
                         f"{v.stride()} for shape {list(v.shape)}")  # fmt: skip
    return v.stride(1)


def state_rows(batch: int, steps: int, sequences: int | None) -> int:
    """Rows of the chunk start states ``[rows, H, K, V]`` for ``[batch, steps]`` inputs, from shapes alone (a fake
    tensor gets the same): every chunk for equal lengths; with ``sequences`` packed into ``batch · steps`` tokens
    (varlen), a bound on their chunk count, ``Σ ⌈lᵢ / 64⌉ ≤ ⌊Σ lᵢ / 64⌋ + sequences`` (rows past it go unused)."""
    if sequences is None:
        return batch * cdiv(steps, CHUNK)
    return batch * steps // CHUNK + sequences


def chunk_forward(
    q, k, w, v, g, beta, *, erase, scale, initial_state, output_final_state, cu_seqlens, fp32_accurate=True,
    need_output=True, kept=None, read=None, keep_u_v=False,
):  # fmt: skip
    """Forward launches. ``k``: the erase direction (the write key when tied or without erase); ``w``: the write
    key when decoupled (w ≠ k), else None; ``read``: the vector the erase reads the state along (``b ⊙ k``, Gated
    DeltaNet-2's gated erase), k when None. Returns ``(o, final_state, saved)``, ``saved`` for the backward.
    ``need_output=False`` (the backward's recomputation) skips the output kernel where nothing else needs it
    (then ``o`` is None): with per-head decay it also forms ``A_qk``, so there it runs. ``kept``: a dict with
    ``states`` and ``U`` of an earlier forward on the same inputs (``saved["states"]``, ``saved["U"]``), which
    skips the sequential state pass (then no final state), and ``intra`` and ``W_s`` (``saved["intra"]``,
    ``saved["W_s"]``), which skip the intra-chunk and solve kernels; with erase off the fused path, kept intra-chunk
    matrices without kept states need the solve's ``U_v`` (``saved["U_v"]``) too. On the fused path (``fused_path``)
    the forward forms no W_s and no U_v (None in ``saved``); ``need_output=False`` forms W_s, from the kept T if
    there is one, for the backward state pass. ``keep_u_v``: ``saved["U_v"]`` is the solve's U_v (for a backward
    that reruns the state pass), else None (freed after the state pass, before the output is allocated)."""
    layout = _Layout(q, v, g, cu_seqlens, fp32_accurate, decoupled=w is not None)
    H, K, V, TT, NT = layout.heads, layout.key_dim, layout.value_dim, layout.tokens, layout.num_chunks
    device, dtype = q.device, q.dtype
    common = dict(cu_seqlens=layout.cu_seqlens, chunk_index=layout.chunk_index)
    has_beta, decoupled = beta is not None, w is not None
    v_stride = _token_stride(v)

    G = None
    if g is not None:
        channels = K if layout.decay == DECAY_CHANNEL.value else 1
        G = torch.empty(g.shape, dtype=torch.float32, device=device)
        block = min(64, next_power_of_2(channels))
        chunk_cumsum_kernel[(NT, H, cdiv(channels, block))](
            g, G, None, **common, H=H, D=channels, BD=block, DE=1, BDE=1, BT=CHUNK, REVERSE=False, HAS_EXTRA=False,
        )  # fmt: skip

    kept = kept or {}
    intra_kept, states_kept = kept.get("intra") is not None, kept.get("states") is not None
    per_channel = layout.decay == DECAY_CHANNEL.value
    fused = fused_path(erase, decoupled, read is not None, per_channel, K)
    if intra_kept and erase and not fused and not states_kept and kept.get("U_v") is None:
        raise ValueError("chunk_forward: kept intra-chunk matrices need the kept states or the solve's U_v too")
    names = intra_names(erase, decoupled, fused)
    size = intra_bytes(names, dtype, TT, H)
    intra = kept["intra"] if intra_kept else torch.empty(size, dtype=torch.uint8, device=device)
    matrices = dict.fromkeys(("A_kk", "A_qw", "A_kw", "T")) | intra_views(intra, names, dtype, TT, H)
    A_qk, A_kk, A_qw, A_kw, T = (matrices[name] for name in ("A_qk", "A_kk", "A_qw", "A_kw", "T"))
    intra_grid = (NT, H, (CHUNK // SUB_CHUNK) ** 2 if per_channel else 1)
    intra_warps = {DECAY_CHANNEL.value: "intra_channel", DECAY_HEAD.value: "intra_head"}.get(layout.decay, "intra")
    # the output kernel forms A_qk with per-head decay, and on the fused path, where the solve forms A_kk: the intra
    # kernel runs for the rest, and with per-head decay only for an erase or a decoupled key
    form_qk = layout.decay == DECAY_HEAD.value or fused
    needs_intra = not fused and (layout.decay != DECAY_HEAD.value or erase or decoupled)
    if not intra_kept and needs_intra:
        chunk_intra_kernel[intra_grid](
            q, k, w, read, G, A_qk, A_kk, A_qw, A_kw, **common, scale=scale, H=H, K=K, BT=CHUNK, BC=SUB_CHUNK,
            BK=_block(K, 64), DECAY=layout.decay, ERASE=erase, DECOUPLED=decoupled, READ=read is not None,
            PREC=layout.precision,
            num_warps=layout.warps(intra_warps), num_stages=layout.stages_of(intra_warps),
        )  # fmt: skip

    # On the fused path the state pass forms U from T (FROM_T): W_s only for the backward's state pass (the
    # recomputation, need_output=False), U_v never. Elsewhere the state pass reads both.
    W_s = U = U_v = None
    if erase and intra_kept:
        W_s, U_v = kept.get("W_s"), kept.get("U_v")
    need_w = erase and W_s is None and (not fused or not need_output)
    need_u = erase and not fused and not states_kept and U_v is None
    if erase and (not intra_kept or need_w or need_u):
        W_s = torch.empty(TT, H, K, dtype=dtype, device=device) if need_w else W_s
        # in the inputs' dtype, as FLA keeps its u: half the fp32 traffic between the solve and the state pass
        U_v = torch.empty(TT, H, V, dtype=dtype, device=device) if need_u else U_v
        chunk_solve_wu_kernel[(NT, H)](  # W_s from the read vector
            k if read is None else read, v, beta, G, A_kk, A_kw, T, W_s, U_v, **common, v_stride=v_stride, H=H, K=K,
            V=V, BT=CHUNK,
            BC=SUB_CHUNK,
            BK=_block(K, SOLVE_WU_BLOCK), BV=_block(V, SOLVE_WU_BLOCK), DECAY=layout.decay, HAS_BETA=has_beta,
            DECOUPLED=decoupled, LOAD_T=intra_kept, STORE_W=need_w, STORE_VALUES=need_u,
            FORM_KK=fused and not intra_kept, BKK=_block(K, SOLVE_KK_BLOCK), PREC=layout.precision,
            num_warps=layout.warps("solve_wu"), num_stages=layout.stages_of("solve_wu"),
        )  # fmt: skip

    final = new_output((layout.sequences, H, K, V), torch.float32, device) if output_final_state else None
    if states_kept:
        if output_final_state:
            raise ValueError("chunk_forward: kept states give no final state; pass output_final_state=False")
        states, U = kept["states"], kept["U"]
    else:
        states = torch.empty(layout.state_rows, H, K, V, dtype=dtype, device=device)
        U = torch.empty(TT, H, V, dtype=dtype, device=device) if erase else None
        block_v = _state_block_v(layout)
        chunk_state_fwd_kernel[(cdiv(V, block_v), layout.sequences * H)](
            k, w, v, beta, G, T, W_s, U_v, U, states, initial_state, final, layout.cu_seqlens, layout.chunk_offsets,
            v_stride=v_stride, H=H, K=K, V=V, BT=CHUNK, BK=layout.block_k, BV=block_v, DECAY=layout.decay, ERASE=erase,
            HAS_BETA=has_beta, DECOUPLED=decoupled, USE_INITIAL_STATE=initial_state is not None,
            STORE_FINAL_STATE=output_final_state, FROM_T=fused, PREC=layout.precision,
            num_warps=layout.warps("state_fwd"), num_stages=layout.state_stages,
        )  # fmt: skip
    if not keep_u_v:
        U_v = None

    o = None
    if need_output or form_qk and not intra_kept:
        o = new_output(v.shape, v.dtype, device)
        block_v = _block(V, OUTPUT_BLOCK_V)
        chunk_output_kernel[(cdiv(V, block_v), NT, H)](
            q, k, v, beta, G, states, U, A_qk, A_qw, o, **common, v_stride=v_stride, scale=scale, H=H, K=K, V=V,
            BT=CHUNK, BK=_block(K, 64), BV=block_v, DECAY=layout.decay, ERASE=erase, HAS_BETA=has_beta,
            DECOUPLED=decoupled, FORM_QK=form_qk, PREC=layout.precision, num_warps=layout.warps("output"),
            num_stages=layout.stages_of("output"),
        )  # fmt: skip
    saved = dict(layout=layout, G=G, A_qk=A_qk, A_kk=A_kk, A_qw=A_qw, A_kw=A_kw, T=T, W_s=W_s, U_v=U_v, U=U,
                 states=states, intra=intra)  # fmt: skip
    return o, final, saved


def fused_path(erase: bool, decoupled: bool, has_read: bool, per_channel: bool, key_dim: int) -> bool:
    """A tied erase along k with no or per-head decay and K ≤ ``FUSED_MAX_K`` (DeltaNet, Gated DeltaNet): the
    solve forms A_kk itself (no intra kernel, A_kk never stored), the output kernel A_qk, and one backward kernel
    follows the state pass."""
    return erase and not decoupled and not has_read and not per_channel and key_dim <= FUSED_MAX_K


def intra_names(erase: bool, decoupled: bool, fused: bool) -> tuple[str, ...]:
    """The intra-chunk matrices ``[TT, H, 64]`` a forward forms, in their order in ``saved["intra"]``: ``A_qk``; with
    erase ``A_kk`` (not on the ``fused`` path) and ``T``; decoupled ``A_qw`` and ``A_kw``."""
    erase_names = ("T",) if fused else ("A_kk", "T")
    return ("A_qk",) + (erase_names if erase else ()) + (("A_qw", "A_kw") if decoupled else ())


def _intra_dtype(name: str, dtype: torch.dtype) -> torch.dtype:
    """A_qk in the inputs' dtype (every kernel that reads it rounds it to that dtype for a product first: the same
    bits, half the traffic), the others fp32 (they enter fp32 products and sums)."""
    return dtype if name == "A_qk" else torch.float32


def intra_bytes(names: tuple[str, ...], dtype: torch.dtype, tokens: int, heads: int) -> int:
    """Size of the byte buffer ``saved["intra"]`` holding the matrices ``names`` for inputs of ``dtype``."""
    return sum(tokens * heads * CHUNK * _intra_dtype(name, dtype).itemsize for name in names)


def intra_views(buffer: Tensor, names: tuple[str, ...], dtype: torch.dtype, tokens: int, heads: int) -> dict:
    """The matrices ``[tokens, heads, 64]`` inside the byte buffer ``buffer`` (``intra_bytes``), one after the
    other in ``names``' order, each in its dtype (``_intra_dtype``)."""
    views, offset = {}, 0
    for name in names:
        size = intra_bytes((name,), dtype, tokens, heads)
        views[name] = buffer[offset : offset + size].view(_intra_dtype(name, dtype)).view(tokens, heads, CHUNK)
        offset += size
    return views


def _block(size: int, cap: int) -> int:
    """Tile width for a dimension: a power of two, at least 16 (the smallest matmul tile), at most ``cap``."""
    return max(16, min(cap, next_power_of_2(size)))


def _state_block_v(layout: _Layout) -> int:
    """Value columns per state-pass program: at most ``STATE_BLOCK_V`` for the key width (the whole ``[K, BV]``
    state sits in registers), fewer while that leaves under ``STATE_MIN_PROGRAMS`` programs to fill the GPU."""
    cap = next(block for width, block in STATE_BLOCK_V.items() if layout.key_dim <= width)
    block_v = _block(layout.value_dim, cap)
    programs = layout.sequences * layout.heads
    while block_v > 16 and programs * cdiv(layout.value_dim, block_v) < STATE_MIN_PROGRAMS:
        block_v //= 2
    return block_v


def chunk_backward(do, d_final, q, k, w, v, g, beta, initial_state, saved, *, erase, scale, fold=None, read=None):
    """Backward launches (arguments as ``chunk_forward``). Returns ``(dq, dk, dw, dv, dg, dbeta, d_initial,
    d_log_gamma, d_read)``. ``fold``: ``(Γ [H, K] fp32, (q's dtype, w's dtype))`` when q and w are GammaNet's folded
    ``Γq``, ``Γ⁻¹w``: then dq and dw are those of the unfolded inputs, in those dtypes, and ``d_log_gamma`` ``[H, K]``
    fp32 (``fused.fold_backward``'s results, fused into the last kernel with per-channel decay); else None. With
    ``read`` given, dk (fp32) is k's gradient as the erase direction only and ``d_read`` (fp32) the read vector's;
    else ``d_read`` is None."""
    layout: _Layout = saved["layout"]
    H, K, V, TT, NT = layout.heads, layout.key_dim, layout.value_dim, layout.tokens, layout.num_chunks
    device, dtype = q.device, q.dtype
    common = dict(cu_seqlens=layout.cu_seqlens, chunk_index=layout.chunk_index)
    has_beta, decoupled, decay, precision = beta is not None, w is not None, layout.decay, layout.precision
    if fold is not None and not decoupled:
        raise ValueError("chunk_backward: the fold needs a decoupled write key")
    G, states = saved["G"], saved["states"]
    do = do.contiguous()
    v_stride = _token_stride(v)
    f32 = dict(dtype=torch.float32, device=device)

    def buffers(count, *shape, when=True):
        return [torch.empty(*shape, **f32) if when else None for _ in range(count)]

    dstates = torch.empty(NT, H, K, V, dtype=dtype, device=device)
    (dU,) = buffers(1, TT, H, V)
    d_initial = new_output(initial_state.shape, torch.float32, device) if initial_state is not None else None
    local_first = STATE_BWD_LOCAL_FIRST
    if local_first is None:
        local_first = NT >= LOCAL_FIRST_MIN_CHUNKS * layout.sequences
    if local_first:
        block_v = _block(V, 64)
        chunk_bwd_local_du_kernel[(cdiv(V, block_v), NT, H)](
            saved["A_qk"], do, dU, **common, H=H, V=V, BT=CHUNK, BV=block_v, PREC=precision,
            num_warps=layout.warps("local_du"), num_stages=layout.stages_of("local_du"),
        )  # fmt: skip
    block_v = _state_block_v(layout)
    chunk_state_bwd_kernel[(cdiv(V, block_v), layout.sequences * H)](
        q, k, G, saved["W_s"], saved["A_qk"], do, dU, dstates, d_initial,
        None if d_final is None else d_final.contiguous(), layout.cu_seqlens, layout.chunk_offsets, scale,
        H=H, K=K, V=V, BT=CHUNK, BK=layout.block_k, BV=block_v, DECAY=decay, ERASE=erase,
        USE_INITIAL_STATE=initial_state is not None, USE_FINAL_GRAD=d_final is not None,
        LOCAL_DONE=local_first, PREC=precision, num_warps=layout.warps("state_bwd"),
        num_stages=layout.state_stages,
    )  # fmt: skip

    if fused_path(erase, decoupled, read is not None, decay == DECAY_CHANNEL.value, K):
        dq = new_output(q.shape, q.dtype, device)
        dk, dv = (new_output(x.shape, x.dtype, device) for x in (k, v))
        dg = new_output(g.shape, g.dtype, device) if g is not None else None
        dbeta = new_output(beta.shape, beta.dtype, device) if has_beta else None
        chunk_bwd_fused_kernel[(NT, H)](
            q, k, v, beta, G, saved["T"], states, dstates, saved["U"], dU, do, dq, dk, dv, dg, dbeta,
            **common, v_stride=v_stride, scale=scale, H=H, K=K, V=V, BT=CHUNK, BK=_block(K, FUSED_MAX_K),
            BV=_block(V, FUSED_BLOCK_V),
            DECAY=decay, HAS_BETA=has_beta, PREC=precision, num_warps=layout.warps("fused"),
            num_stages=layout.stages_of("fused"),
        )  # fmt: skip
        return dq, dk, None, dv, dg, dbeta, d_initial, None, None

    dq_part, dk_minus = buffers(2, TT, H, K)
    (dW_s,) = buffers(1, TT, H, K, when=erase)
    (dw_minus,) = buffers(1, TT, H, K, when=decoupled)
    (dG_last,) = buffers(1, NT, H, K, when=g is not None)
    block_k = _block(K, 64)
    chunk_bwd_main_kernel[(cdiv(K, block_k), NT, H)](
        k, w, v, beta, G, states, dstates, saved["U"], dU, do, dq_part, dk_minus, dw_minus, dW_s, dG_last, **common,
        v_stride=v_stride, scale=scale, H=H, K=K, V=V, BT=CHUNK, BK=block_k, BV=_block(V, 64), DECAY=decay, ERASE=erase,
        HAS_BETA=has_beta, DECOUPLED=decoupled, PREC=precision, num_warps=layout.warps("main"),
        num_stages=layout.stages_of("main"),
    )  # fmt: skip

    (dA_qk,) = buffers(1, TT, H, CHUNK)
    (dA_qw,) = buffers(1, TT, H, CHUNK, when=decoupled)
    dk_plus, dA_kk = buffers(1, TT, H, K, when=erase) + buffers(1, TT, H, CHUNK, when=erase)
    (dA_kw,) = buffers(1, TT, H, CHUNK, when=decoupled)
    (dbeta,) = buffers(1, TT, H, when=has_beta)
    dv = new_output(v.shape, v.dtype, device)
    chunk_bwd_local_kernel[(NT, H)](
        k if read is None else read, w, v, beta, G, saved["T"], saved["A_kk"], saved["A_qw"], saved["A_kw"],
        saved["U"], dU, dstates, do, dW_s,
        dv, dbeta, dk_plus, dA_qk, dA_qw, dA_kk, dA_kw, **common, v_stride=v_stride, scale=scale, H=H, K=K, V=V,
        BT=CHUNK, BK=block_k,
        BV=_block(V, 64), BK_ALL=layout.block_k, DECAY=decay, ERASE=erase, HAS_BETA=has_beta, DECOUPLED=decoupled,
        PREC=precision, num_warps=layout.warps("local"), num_stages=layout.stages_of("local"),
    )  # fmt: skip
    del dU, dW_s, dstates

    per_channel = decay == DECAY_CHANNEL.value
    fused_fold = fold is not None and per_channel
    if fused_fold:
        dq_dtype, dw_dtype = fold[1]
    elif fold is not None:  # the folded inputs' gradients in fp32, for fused.fold_backward
        dq_dtype = dw_dtype = torch.float32
    else:
        dq_dtype, dw_dtype = q.dtype, w.dtype if decoupled else None
    dq = new_output(q.shape, dq_dtype, device)
    dk = new_output(k.shape, k.dtype if read is None else torch.float32, device)  # fp32: read's part is added later
    dw = new_output(w.shape, dw_dtype, device) if decoupled else None
    d_read = new_output(k.shape, torch.float32, device) if read is not None else None
    dG = torch.empty(g.shape, **f32) if g is not None else None
    grid = (NT, H, (CHUNK // SUB_CHUNK) * cdiv(K, block_k) if per_channel else 1)
    bwd_intra = "bwd_intra_channel" if per_channel else "bwd_intra"
    d_log_gamma_partial = torch.zeros(NT * (CHUNK // SUB_CHUNK), H, K, **f32) if fused_fold else None
    chunk_bwd_intra_kernel[grid](
        q, k, w, read, G, dA_qk, dA_kk, dA_qw, dA_kw, dq_part, dk_minus, dk_plus, dw_minus, dq, dk, dw, d_read, dG,
        fold[0] if fused_fold else None, d_log_gamma_partial, **common, H=H, K=K, BT=CHUNK, BC=SUB_CHUNK,
        BK=block_k, DECAY=decay, ERASE=erase, DECOUPLED=decoupled, READ=read is not None, FOLD=fused_fold,
        PREC=precision,
        num_warps=layout.warps(bwd_intra), num_stages=layout.stages_of(bwd_intra),
    )  # fmt: skip
    d_log_gamma = None
    if fused_fold:
        d_log_gamma = d_log_gamma_partial.sum(0)
    elif fold is not None:
        from linrnn.kernels.triton.fused import fold_backward

        dq, dw, d_log_gamma = fold_backward(q, w, fold[0], dq, dw, fold[1])

    dg = None
    if g is not None:
        channels = K if per_channel else 1
        dg = new_output(g.shape, g.dtype, device)
        block = min(64, next_power_of_2(channels))
        chunk_cumsum_kernel[(NT, H, cdiv(channels, block))](
            dG, dg, dG_last, **common, H=H, D=channels, BD=block, DE=K, BDE=layout.block_k, BT=CHUNK, REVERSE=True,
            HAS_EXTRA=True,
        )  # fmt: skip
    if dbeta is not None:
        dbeta = dbeta.to(beta.dtype).view(beta.shape)
    return dq, dk, dw, dv, dg, dbeta, d_initial, d_log_gamma, d_read
