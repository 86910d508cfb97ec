"""Public per-cell ops with flash-linear-attention (FLA) conventions, and backend dispatch.

Layout ``[B, T, H, D]``; state ``[N, H, K, V]``; default ``scale = K ** -0.5``;
inputs are used as given (no normalisation inside). Every op returns
``(o, final_state)`` with ``final_state`` None unless ``output_final_state``.

Backends: ``"reference"`` (sequential loop, value checks always on),
``"torch"`` (chunkwise, ``chunked.py``), ``"triton"`` (Triton kernels: the chunkwise
forward and backward of ``kernels/triton/chunk.py`` for training and long
sequences; the fused recurrent forward for decoding, sequences of up to
``FUSED_RECURRENT_MAX_STEPS`` steps without autograd), ``"auto"`` (Triton on CUDA,
torch elsewhere). GammaNet's fold (``Γq``, ``Γ⁻¹k``) happens inside the chunkwise
custom op (``library.fold``), which also returns the gradient of ``log_gamma``;
the states are folded around it here, in at least fp32.
The final state is fp32 (fp64 for fp64 inputs); ``o`` has ``v``'s dtype.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from linrnn.kernels.library import chunk_recurrence
from linrnn.kernels.reference import compute_dtype, recurrence_reference
from linrnn.kernels.validation import (
    check_cu_seqlens,
    check_gate_values,
    check_options,
    check_same,
    check_tensor,
    check_unit_rows,
    fail,
)

MAX_TRITON_DIM = 256  # K, V limit of the Triton kernels (the state tile lives in registers)
FUSED_RECURRENT_MAX_STEPS = 64  # without autograd, sequences up to this long run step by step (decoding)


@dataclass(frozen=True)
class _Options:
    """The keyword options every op shares (documented on ``recurrence``)."""

    scale: float | None
    initial_state: Tensor | None
    output_final_state: bool
    cu_seqlens: Tensor | None
    backend: str
    chunk_size: int | None
    check_values: bool
    update_state_in_place: bool = False


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
    update_state_in_place: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """The generalized recurrence every cell is a case of::

        S_t = (I − β_t e_t e_tᵀ) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)

    Args:
        q, k: ``[B, T, H, K]`` query and write key; v: ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]`` (per head) or ``[B, T, H, K]`` (per channel); None: no decay.
        beta: write/erase strength ``[B, T, H]`` in [0, 2]; None: 1.
        e: erase direction ``[B, T, H, K]`` (unit rows); None: tied, e = k.
        erase: False drops the erase term (GLA); then ``e`` must be None.
        scale: query scale; None: ``K ** -0.5``.
        initial_state: ``[N, H, K, V]``, N = B, or the number of sequences with ``cu_seqlens``.
        output_final_state: also return the state after the last step (fp32; fp64 for fp64 inputs).
        cu_seqlens: ``[N + 1]`` int boundaries of sequences packed along T (B = 1); states reset per sequence.
            On the CPU or on q's device; on the CPU, reading the boundaries (grid sizes) costs no device sync.
        backend: "auto" | "torch" | "reference" | "triton" (forward only in this version, see the module docstring).
        chunk_size: chunk length of the chunkwise backends (default 32).
        check_values: also check gate values (finite, g ≤ 0, beta in [0, 2]); reads tensor contents,
            so it costs a device sync. Always on with backend="reference".
        update_state_in_place: write the final state into ``initial_state`` (required: contiguous, fp32, fp64
            for fp64 inputs, no autograd) and return it as the final state. Decoding engines keep one state buffer
            per slot; the fused recurrent kernel then reads and writes it in one pass, without a second buffer.
    """
    op = "linrnn.ops.recurrence"
    options = _Options(
        scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values, update_state_in_place
    )
    if not erase and e is not None:
        fail(op, "argument 'e' must be None when erase=False, got a tensor")
    _check(op, q, k, v, options, g=g, g_kind="any", beta=beta, e=e)
    erase_direction = (k if e is None else e) if erase else None
    return _dispatch(op, q, k, v, erase_direction, g, beta, options)


def gla(q, k, v, g, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        backend="auto", chunk_size=None, check_values=False, update_state_in_place=False):  # fmt: skip
    """Gated linear attention: ``S_t = Diag(exp g_t) S_{t−1} + k_t v_tᵀ``; g ``[B, T, H, K]``.
    Options as in ``recurrence``."""
    op = "linrnn.ops.gla"
    options = _Options(
        scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values, update_state_in_place
    )
    _check(op, q, k, v, options, g=g, g_kind="channel")
    return _dispatch(op, q, k, v, None, g, None, options)


def delta_rule(q, k, v, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
               backend="auto", chunk_size=None, check_values=False, update_state_in_place=False):  # fmt: skip
    """DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ``; beta ``[B, T, H]``.
    Options as in ``recurrence``."""
    op = "linrnn.ops.delta_rule"
    options = _Options(
        scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values, update_state_in_place
    )
    _check(op, q, k, v, options, beta=beta, beta_required=True)
    return _dispatch(op, q, k, v, k, None, beta, options)


def gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                     cu_seqlens=None, backend="auto", chunk_size=None, check_values=False,
                     update_state_in_place=False):  # fmt: skip
    """Gated DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) exp(g_t) S_{t−1} + β_t k_t v_tᵀ``; g, beta ``[B, T, H]``.
    Options as in ``recurrence``."""
    op = "linrnn.ops.gated_delta_rule"
    options = _Options(
        scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values, update_state_in_place
    )
    _check(op, q, k, v, options, g=g, g_kind="head", beta=beta, beta_required=True)
    return _dispatch(op, q, k, v, k, g, beta, options)


def kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None,
        backend="auto", chunk_size=None, check_values=False, update_state_in_place=False):  # fmt: skip
    """Kimi Delta Attention: GDN with per-channel decay, g ``[B, T, H, K]``, beta ``[B, T, H]``.
    Options as in ``recurrence``."""
    op = "linrnn.ops.kda"
    options = _Options(
        scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values, update_state_in_place
    )
    _check(op, q, k, v, options, g=g, g_kind="channel", beta=beta, beta_required=True)
    return _dispatch(op, q, k, v, k, g, beta, options)


def gammanet(q, k, v, a, g, beta, log_gamma, *, scale=None, initial_state=None, output_final_state=False,
             cu_seqlens=None, backend="auto", chunk_size=None, check_values=False,
             update_state_in_place=False):  # fmt: skip
    """GammaNet (seed 003) in FLA orientation, Γ = Diag(exp log_gamma) per head::

        S_t = (I − β_t Γ a_t a_tᵀ Γ⁻¹) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)

    a ``[B, T, H, K]`` (unit rows), g ``[B, T, H, K]``, beta ``[B, T, H]``, log_gamma ``[H, K]``;
    options as in ``recurrence`` (``check_values`` also checks that ``a`` has unit rows).

    Computed through the fold identity: with ``S̃ = Γ⁻¹ S`` this is the generalized
    recurrence with erase ``e = a``, write key ``Γ⁻¹ k`` and query ``Γ q``;
    the initial state goes in as ``Γ⁻¹ S_0`` and the final state comes out as ``Γ S̃_T``.
    States in and out are always the true ``S``.
    """
    op = "linrnn.ops.gammanet"
    options = _Options(
        scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values, update_state_in_place
    )
    _check(op, q, k, v, options, g=g, g_kind="channel", beta=beta, beta_required=True, e=a, e_name="a")
    check_tensor(op, "log_gamma", log_gamma, [q.shape[2], q.shape[3]], "[H, K]")
    check_same(op, {"q": q, "log_gamma": log_gamma}, "device")
    if check_values or backend == "reference":
        check_unit_rows(op, "a", a)
    return _dispatch(op, q, k, v, a, g, beta, options, log_gamma=log_gamma)


def _check(op, q, k, v, options, *, g=None, g_kind=None, beta=None, beta_required=False, e=None, e_name="e"):
    check_options(op, options.backend, options.chunk_size)
    check_tensor(op, "q", q, ["B", "T", "H", "K"], "[B, T, H, K]")
    batch, steps, heads, key_dim = q.shape
    if steps < 1:
        fail(op, f"argument 'q' must have at least one time step (T >= 1), got shape {list(q.shape)}")
    check_tensor(op, "k", k, [batch, steps, heads, key_dim], "[B, T, H, K]")
    check_tensor(op, "v", v, [batch, steps, heads, "V"], "[B, T, H, V]")
    if e is not None:
        check_tensor(op, e_name, e, [batch, steps, heads, key_dim], "[B, T, H, K]")
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
    initial_state, cu_seqlens = options.initial_state, options.cu_seqlens
    check_same(op, {"q": q, "k": k, "v": v, e_name: e}, "dtype")
    tensors = {"q": q, "k": k, "v": v, e_name: e, "g": g, "beta": beta, "initial_state": initial_state}
    check_same(op, tensors, "device")
    sequences = batch if cu_seqlens is None else check_cu_seqlens(op, cu_seqlens, batch, steps, q.device)
    if initial_state is not None:
        expected = [sequences, heads, key_dim, v.shape[-1]]
        check_tensor(op, "initial_state", initial_state, expected, "[N, H, K, V] (N = B, or sequences in cu_seqlens)")
    if options.update_state_in_place:
        _check_state_buffer(op, initial_state, compute_dtype(q.dtype), (q, k, v, e, g, beta))


def _check_state_buffer(op, state, dtype, tensors) -> None:
    """``update_state_in_place``: the initial state is the buffer the final state is written into."""
    if state is None:
        fail(op, "update_state_in_place=True needs argument 'initial_state' (the buffer to update), got None")
    if state.dtype != dtype or not state.is_contiguous():
        fail(op, f"update_state_in_place=True needs a contiguous {dtype} 'initial_state', got "
                 f"{'a contiguous' if state.is_contiguous() else 'a non-contiguous'} {state.dtype} tensor")  # fmt: skip
    if _needs_grad((*tensors, state)):
        fail(op, "update_state_in_place=True is for inference: no input may require grad while autograd is on")


def _dispatch(op, q, w, v, e, g, beta, options, log_gamma=None):
    """Picks the implementation and runs it; ``log_gamma`` (GammaNet) is folded inside the fused recurrent
    kernel and here, in torch, for the other paths."""
    if options.check_values or options.backend == "reference":
        check_gate_values(op, g, beta)
    args = dict(
        scale=q.shape[-1] ** -0.5 if options.scale is None else options.scale,
        initial_state=options.initial_state,
        output_final_state=options.output_final_state,
        cu_seqlens=options.cu_seqlens,
    )
    use_triton = options.backend == "triton" or (options.backend == "auto" and q.is_cuda)
    if use_triton:
        problem = _triton_problem((q, w, v, e, g, beta, options.initial_state, log_gamma))
        if problem and options.backend == "triton":
            fail(op, f"backend 'triton' {problem}")
        use_triton = problem is None  # "auto" falls back to the torch path, saying so once per reason
        if problem and q.is_cuda:
            _warn_fallback(op, problem)
    if (
        use_triton
        and not _needs_grad((q, w, v, e, g, beta, options.initial_state, log_gamma))
        and (_longest(q, options.cu_seqlens) <= FUSED_RECURRENT_MAX_STEPS)
    ):
        from linrnn.kernels.triton.fused_recurrent import fused_recurrent_fwd

        if options.update_state_in_place:  # each program reads its state tile before it writes it
            return fused_recurrent_fwd(q, w, v, e, g, beta, log_gamma=log_gamma, final_state=args["initial_state"],
                                       **{**args, "output_final_state": True})  # fmt: skip
        return fused_recurrent_fwd(q, w, v, e, g, beta, log_gamma=log_gamma, **args)
    if options.update_state_in_place:
        o, final = _dispatch(op, q, w, v, e, g, beta, replace(options, update_state_in_place=False,
                                                              output_final_state=True), log_gamma)  # fmt: skip
        return o, options.initial_state.copy_(final)

    out_dtype = v.dtype
    if log_gamma is not None:  # the fold identity: run on Γ⁻¹S with query Γq, write key Γ⁻¹k, erase e
        gamma = log_gamma.to(compute_dtype(q.dtype)).exp()  # [H, K]
        if args["initial_state"] is not None:  # the state in at least fp32 (as the kernels keep it)
            args["initial_state"] = args["initial_state"].to(gamma.dtype) / gamma[:, :, None]
    if options.backend == "reference":
        if log_gamma is not None:
            q, w, e, v = (x.to(gamma.dtype) for x in (q, w, e, v))
            q, w = q * gamma, w / gamma
        o, final = recurrence_reference(q, w, v, e, g, beta, **args)
    else:  # the custom op (linrnn.kernels.library), which folds q and w itself: torch.compile traces through it
        o, final = chunk_recurrence(q, w, v, e, g, beta, backend="triton" if use_triton else "torch",
                                    chunk_size=options.chunk_size, fp32_accurate=out_dtype == torch.float32,
                                    log_gamma=log_gamma, **args)  # fmt: skip
    if log_gamma is not None and final is not None:
        final = final * gamma[:, :, None]
    return o.to(out_dtype), final


@functools.cache
def _warn_fallback(op: str, problem: str) -> None:
    warnings.warn(f"{op}: backend 'auto' runs the PyTorch chunkwise path on CUDA because the Triton kernels {problem}",
                  stacklevel=4)  # fmt: skip


def _needs_grad(tensors) -> bool:
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in tensors)


def _longest(q: Tensor, cu_seqlens: Tensor | None) -> int:
    """The longest sequence's length; an upper bound (T) under torch.compile, where the boundaries are data."""
    if cu_seqlens is None or torch.compiler.is_compiling():
        return q.shape[1]
    return int(cu_seqlens.diff().max())


# looked up once at import (without importing triton): torch.compile cannot trace importlib.util.find_spec
TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def _triton_problem(tensors) -> str | None:
    """Why the Triton kernels cannot take these inputs, or None."""
    q, v = tensors[0], tensors[2]
    if not q.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return f"needs CUDA tensors (or TRITON_INTERPRET=1 on CPU), got device {q.device}"
    if not TRITON_INSTALLED:
        return "needs the triton package, which is not installed"
    if q.dtype == torch.float64:
        return "computes in fp32, got float64 inputs; use backend 'torch' or 'reference' for fp64"
    if q.shape[-1] > MAX_TRITON_DIM or v.shape[-1] > MAX_TRITON_DIM:
        return f"supports K and V up to {MAX_TRITON_DIM}, got K = {q.shape[-1]}, V = {v.shape[-1]}"
    return None
