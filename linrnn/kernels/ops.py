"""Public per-cell ops with flash-linear-attention (FLA) conventions, and backend dispatch.

Layout ``[B, T, H, D]``; state ``[N, H, K, V]``; default ``scale = K ** -0.5``;
inputs are used as given (no normalisation inside). Every op returns
``(o, final_state)`` with ``final_state`` None unless ``output_final_state``.

Backends: ``"reference"`` (sequential loop, value checks always on),
``"torch"`` (chunkwise, ``chunked.py``), ``"auto"`` (the fastest available:
the torch chunked path in this version), ``"triton"`` (not in this version).
The final state is fp32 (fp64 for fp64 inputs); ``o`` has ``v``'s dtype.
"""

from __future__ import annotations

from torch import Tensor

from linrnn.kernels.chunked import recurrence_chunked
from linrnn.kernels.reference import compute_dtype, recurrence_reference
from linrnn.kernels.validation import (
    check_cu_seqlens,
    check_options,
    check_same,
    check_tensor,
    check_unit_rows,
    check_values,
    fail,
)

# Per-channel decay makes the torch path's pairwise decay [C, C, K] per chunk: smaller chunks.
DEFAULT_CHUNK = {"none": 64, "head": 64, "channel": 32}


def recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    e: Tensor | None = None,
    *,
    erase: bool = True,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: Tensor | None = None,
    backend: str = "auto",
    chunk_size: int | None = None,
    check_values: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The generalized recurrence every cell is a case of::

        S_t = (I − β_t e_t e_tᵀ) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)

    Args:
        q, k: ``[B, T, H, K]`` query and write key; v: ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]`` (per head) or ``[B, T, H, K]`` (per channel); None: no decay.
        beta: write/erase strength ``[B, T, H]`` in [0, 2]; None: 1.
        e: erase direction ``[B, T, H, K]`` (unit rows); None: tied, e = k.
        erase: False drops the erase term (GLA); then ``e`` must be None.
        initial_state: ``[N, H, K, V]``, N = B, or the number of sequences with ``cu_seqlens``.
        cu_seqlens: ``[N + 1]`` int boundaries of sequences packed along T (B = 1).
        backend: "auto" | "torch" | "reference" ("triton" arrives with the Triton kernels).
        chunk_size: chunk length of the chunkwise backends (default by decay kind).
        check_values: also check gate values (finite, g ≤ 0, beta in [0, 2]); costs a sync.
    """
    op = "linrnn.ops.recurrence"
    if not erase and e is not None:
        fail(op, "argument 'e' must be None when erase=False, got a tensor")
    _check(op, q, k, v, g=g, g_kind="any", beta=beta, e=e, initial_state=initial_state, cu_seqlens=cu_seqlens)
    return _dispatch(
        op,
        q,
        k,
        v,
        (e if e is not None else k) if erase else None,
        g,
        beta,
        scale,
        initial_state,
        output_final_state,
        cu_seqlens,
        backend,
        chunk_size,
        check_values,
    )


def gla(
    q,
    k,
    v,
    g,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    backend="auto",
    chunk_size=None,
    check_values=False,
):
    """Gated linear attention: ``S_t = Diag(exp g_t) S_{t−1} + k_t v_tᵀ``; g ``[B, T, H, K]``."""
    op = "linrnn.ops.gla"
    _check(op, q, k, v, g=g, g_kind="channel", initial_state=initial_state, cu_seqlens=cu_seqlens)
    return _dispatch(
        op,
        q,
        k,
        v,
        None,
        g,
        None,
        scale,
        initial_state,
        output_final_state,
        cu_seqlens,
        backend,
        chunk_size,
        check_values,
    )


def delta_rule(
    q,
    k,
    v,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    backend="auto",
    chunk_size=None,
    check_values=False,
):
    """DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ``; beta ``[B, T, H]``."""
    op = "linrnn.ops.delta_rule"
    _check(op, q, k, v, beta=beta, beta_required=True, initial_state=initial_state, cu_seqlens=cu_seqlens)
    return _dispatch(
        op,
        q,
        k,
        v,
        k,
        None,
        beta,
        scale,
        initial_state,
        output_final_state,
        cu_seqlens,
        backend,
        chunk_size,
        check_values,
    )


def gated_delta_rule(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    backend="auto",
    chunk_size=None,
    check_values=False,
):
    """Gated DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) exp(g_t) S_{t−1} + β_t k_t v_tᵀ``; g, beta ``[B, T, H]``."""
    op = "linrnn.ops.gated_delta_rule"
    _check(
        op,
        q,
        k,
        v,
        g=g,
        g_kind="head",
        beta=beta,
        beta_required=True,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return _dispatch(
        op, q, k, v, k, g, beta, scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values
    )


def kda(
    q,
    k,
    v,
    g,
    beta,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    backend="auto",
    chunk_size=None,
    check_values=False,
):
    """Kimi Delta Attention: GDN with per-channel decay, g ``[B, T, H, K]``, beta ``[B, T, H]``."""
    op = "linrnn.ops.kda"
    _check(
        op,
        q,
        k,
        v,
        g=g,
        g_kind="channel",
        beta=beta,
        beta_required=True,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    return _dispatch(
        op, q, k, v, k, g, beta, scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values
    )


def gammanet(
    q,
    k,
    v,
    a,
    g,
    beta,
    log_gamma,
    *,
    scale=None,
    initial_state=None,
    output_final_state=False,
    cu_seqlens=None,
    backend="auto",
    chunk_size=None,
    check_values=False,
):
    """GammaNet (seed 003) in FLA orientation, Γ = Diag(exp log_gamma) per head::

        S_t = (I − β_t Γ a_t a_tᵀ Γ⁻¹) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)

    a ``[B, T, H, K]`` (unit rows), g ``[B, T, H, K]``, beta ``[B, T, H]``, log_gamma ``[H, K]``.

    Computed through the fold identity: with ``S̃ = Γ⁻¹ S`` this is the generalized
    recurrence with erase ``e = a``, write key ``Γ⁻¹ k`` and query ``Γ q``;
    the initial state goes in as ``Γ⁻¹ S_0`` and the final state comes out as ``Γ S̃_T``.
    States in and out are always the true ``S``.
    """
    op = "linrnn.ops.gammanet"
    _check(
        op,
        q,
        k,
        v,
        g=g,
        g_kind="channel",
        beta=beta,
        beta_required=True,
        e=a,
        initial_state=initial_state,
        cu_seqlens=cu_seqlens,
    )
    check_tensor(op, "log_gamma", log_gamma, [q.shape[2], q.shape[3]], "[H, K]")
    check_same(op, {"q": q, "log_gamma": log_gamma}, "device")
    if check_values or backend == "reference":
        check_unit_rows(op, "a", a)
    dtype = compute_dtype(q.dtype)
    gamma = log_gamma.to(dtype).exp()  # [H, K]
    state = None if initial_state is None else initial_state.to(dtype) / gamma[:, :, None]
    o, final = _dispatch(
        op,
        q.to(dtype) * gamma,
        k.to(dtype) / gamma,
        v,
        a.to(dtype),
        g,
        beta,
        scale,
        state,
        output_final_state,
        cu_seqlens,
        backend,
        chunk_size,
        check_values,
    )
    return o, None if final is None else final * gamma[:, :, None]


def _check(
    op, q, k, v, *, g=None, g_kind=None, beta=None, beta_required=False, e=None, initial_state=None, cu_seqlens=None
):
    check_tensor(op, "q", q, ["B", "T", "H", "K"], "[B, T, H, K]")
    batch, steps, heads, key_dim = q.shape
    if steps < 1:
        fail(op, f"argument 'q' must have at least one time step (T >= 1), got shape {list(q.shape)}")
    check_tensor(op, "k", k, [batch, steps, heads, key_dim], "[B, T, H, K]")
    check_tensor(op, "v", v, [batch, steps, heads, "V"], "[B, T, H, V]")
    erase_name = "a" if op.endswith("gammanet") else "e"
    if e is not None:
        check_tensor(op, erase_name, e, [batch, steps, heads, key_dim], "[B, T, H, K]")
    if g_kind in ("head", "channel") and g is None:
        fail(op, "argument 'g' (log-decay) is required, got None")
    if g is not None:
        if g_kind == "head" or (g_kind == "any" and isinstance(g, Tensor) and g.dim() == 3):
            check_tensor(op, "g", g, [batch, steps, heads], "[B, T, H] (per-head log-decay)")
        else:
            check_tensor(op, "g", g, [batch, steps, heads, key_dim], "[B, T, H, K] (per-channel log-decay)")
    if beta_required and beta is None:
        fail(op, "argument 'beta' is required, got None")
    if beta is not None:
        check_tensor(op, "beta", beta, [batch, steps, heads], "[B, T, H]")
    check_same(op, {"q": q, "k": k, "v": v, erase_name: e}, "dtype")
    check_same(
        op, {"q": q, "k": k, "v": v, erase_name: e, "g": g, "beta": beta, "initial_state": initial_state}, "device"
    )
    sequences = batch if cu_seqlens is None else check_cu_seqlens(op, cu_seqlens, batch, steps)
    if initial_state is not None:
        check_tensor(
            op,
            "initial_state",
            initial_state,
            [sequences, heads, key_dim, v.shape[-1]],
            "[N, H, K, V] (N = B, or the number of sequences in cu_seqlens)",
        )


def _dispatch(
    op,
    q,
    w,
    v,
    e,
    g,
    beta,
    scale,
    initial_state,
    output_final_state,
    cu_seqlens,
    backend,
    chunk_size,
    want_value_checks,
):
    check_options(op, backend, chunk_size)
    if backend == "triton":
        fail(op, "backend 'triton' is not available in this version of linrnn; use 'auto', 'torch' or 'reference'")
    if want_value_checks or backend == "reference":
        check_values(op, g, beta)
    if scale is None:
        scale = q.shape[-1] ** -0.5
    args = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    if backend == "reference":
        return recurrence_reference(q, w, v, e, g, beta, **args)
    decay_kind = "none" if g is None else ("head" if g.dim() == 3 else "channel")
    return recurrence_chunked(q, w, v, e, g, beta, chunk_size=chunk_size or DEFAULT_CHUNK[decay_kind], **args)
