"""The ops: the generalized recurrence (``recurrence``), one op per structure (``run``, which every cell's op
calls with its ``Structure``), FLA's named ops, and backend dispatch. Conventions of flash-linear-attention (FLA).

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
from dataclasses import dataclass, fields, replace

import torch
from torch import Tensor

from linrnn.kernels import TRITON_CHUNK
from linrnn.kernels.library import chunk_recurrence
from linrnn.kernels.reference import compute_dtype, recurrence_reference
from linrnn.kernels.structure import INPUTS, Structure
from linrnn.kernels.validation import (
    check_cu_seqlens,
    check_options,
    check_range,
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

    scale: float | None = None
    initial_state: Tensor | None = None
    output_final_state: bool = False
    cu_seqlens: Tensor | None = None
    backend: str = "auto"
    chunk_size: int | None = None
    check_values: bool = False
    update_state_in_place: bool = False


OPTIONS = tuple(field.name for field in fields(_Options))


def parse_options(given: dict) -> _Options:
    """The ops' keyword options from a dict; an unknown name raises a TypeError naming it."""
    unknown = sorted(set(given) - set(OPTIONS))
    if unknown:
        raise TypeError(f"unexpected keyword argument {unknown[0]!r}; the ops' options are {', '.join(OPTIONS)}")
    return _Options(**given)


# the structures of FLA's named ops; the built-in cells declare theirs through these
GLA = Structure(decay="channel", erase="off", write="one")
DELTA_RULE = Structure(decay="none", erase="tied")
GATED_DELTA_RULE = Structure(decay="head", erase="tied")
KDA = Structure(decay="channel", erase="tied")
GAMMANET = Structure(decay="channel", erase="decoupled", conjugated=True)
GDN2 = Structure(decay="channel", erase="tied", erase_gate="channel", write="channel")
SSD = Structure(decay="head", erase="off", write="beta")


def recurrence(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor | None = None,
    beta: Tensor | None = None,
    e: Tensor | None = None,
    *,
    erase: bool = True,
    erase_gate: Tensor | None = None,
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

        S_t = (I − β_t e_t (b_t ⊙ e_t)ᵀ) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)

    Args:
        q, k: ``[B, T, H, K]`` query and write key; v: ``[B, T, H, V]``.
        g: log-decay ``[B, T, H]`` (per head) or ``[B, T, H, K]`` (per channel); None: no decay.
        beta: write/erase strength ``[B, T, H]``, in [0, 2] with an erase, ≥ 0 without; None: 1.
        e: erase direction ``[B, T, H, K]`` (unit rows); None: tied, e = k.
        erase: False drops the erase term (GLA); then ``e`` and ``erase_gate`` must be None.
        erase_gate: b ``[B, T, H, K]`` in [0, 2], the erase's gate per key channel (Gated DeltaNet-2); None: 1.
        scale: query scale; None: ``K ** -0.5``.
        initial_state: ``[N, H, K, V]``, N = B, or the number of sequences with ``cu_seqlens``.
        output_final_state: also return the state after the last step (fp32; fp64 for fp64 inputs).
        cu_seqlens: ``[N + 1]`` int boundaries of sequences packed along T (B = 1); states reset per sequence.
            On the CPU or on q's device; on the CPU, reading the boundaries (grid sizes) costs no device sync.
        backend: "auto" | "torch" | "reference" | "triton" (module docstring).
        chunk_size: chunk length of the torch chunkwise backend (default 32); the Triton kernels' chunk is fixed
            at ``TRITON_CHUNK`` and the reference is sequential, so they refuse any other value.
        check_values: also check gate values (finite, g ≤ 0, beta and b in range); reads tensor contents,
            so it costs a device sync. Always on with backend="reference".
        update_state_in_place: write the final state into ``initial_state`` (required: contiguous, in the
            compute dtype, fp32 or fp64 for fp64 inputs, or bf16: a decoding state kept in half precision,
            computed in fp32 and rounded once per call; no autograd) and return it as the final state. Decoding
            engines keep one state buffer per slot; the fused recurrent kernel then reads and writes it in one
            pass, without a second buffer.
    """
    op = "linrnn.ops.recurrence"
    if not erase and (e is not None or erase_gate is not None):
        fail(op, f"argument '{'e' if e is not None else 'erase_gate'}' must be None when erase=False, got a tensor")
    if g is not None and isinstance(g, Tensor) and g.dim() == 3:
        decay = "head"
    else:
        decay = "none" if g is None else "channel"
    structure = Structure(
        decay=decay,
        erase="off" if not erase else ("tied" if e is None else "decoupled"),
        erase_gate="channel" if erase_gate is not None else "beta",
        write="one" if beta is None else "beta",
    )
    inputs = {"a": e, "g": g, "beta": beta, "b": erase_gate}
    options = _Options(scale, initial_state, output_final_state, cu_seqlens, backend, chunk_size, check_values,
                       update_state_in_place)  # fmt: skip
    return run(structure, op, q, k, v, {name: inputs[name] for name in structure.input_names()}, options)


def gla(q, k, v, g, **options):
    """Gated linear attention: ``S_t = Diag(exp g_t) S_{t−1} + k_t v_tᵀ``; g ``[B, T, H, K]``.
    Options as in ``recurrence``."""
    return run(GLA, "linrnn.ops.gla", q, k, v, dict(g=g), parse_options(options))


def delta_rule(q, k, v, beta, **options):
    """DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ``; beta ``[B, T, H]``.
    Options as in ``recurrence``."""
    return run(DELTA_RULE, "linrnn.ops.delta_rule", q, k, v, dict(beta=beta), parse_options(options))


def gated_delta_rule(q, k, v, g, beta, **options):
    """Gated DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) exp(g_t) S_{t−1} + β_t k_t v_tᵀ``; g, beta ``[B, T, H]``.
    Options as in ``recurrence``."""
    return run(GATED_DELTA_RULE, "linrnn.ops.gated_delta_rule", q, k, v, dict(g=g, beta=beta), parse_options(options))


def kda(q, k, v, g, beta, **options):
    """Kimi Delta Attention: GDN with per-channel decay, g ``[B, T, H, K]``, beta ``[B, T, H]``.
    Options as in ``recurrence``."""
    return run(KDA, "linrnn.ops.kda", q, k, v, dict(g=g, beta=beta), parse_options(options))


def gammanet(q, k, v, a, g, beta, log_gamma, **options):
    """GammaNet in FLA orientation, Γ = Diag(exp log_gamma) per head::

        S_t = (I − β_t Γ a_t a_tᵀ Γ⁻¹) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ,   o_t = S_tᵀ (scale · q_t)

    a ``[B, T, H, K]`` (unit rows), g ``[B, T, H, K]``, beta ``[B, T, H]``, log_gamma ``[H, K]``;
    options as in ``recurrence`` (``check_values`` also checks that ``a`` has unit rows).

    Computed through the fold identity: with ``S̃ = Γ⁻¹ S`` this is the generalized
    recurrence with erase ``e = a``, write key ``Γ⁻¹ k`` and query ``Γ q``;
    the initial state goes in as ``Γ⁻¹ S_0`` and the final state comes out as ``Γ S̃_T``.
    States in and out are always the true ``S``.
    """
    inputs = dict(a=a, g=g, beta=beta, log_gamma=log_gamma)
    return run(GAMMANET, "linrnn.ops.gammanet", q, k, v, inputs, parse_options(options))


def gdn2(q, k, v, g, b, w, **options):
    """Gated DeltaNet-2 (FLA's ``gdn2``): channel-wise erase and write gates::

        S_t = (I − k_t (b_t ⊙ k_t)ᵀ) Diag(exp g_t) S_{t−1} + k_t (w_t ⊙ v_t)ᵀ

    g, b ``[B, T, H, K]`` (b in [0, 2]), w ``[B, T, H, V]``; options as in ``recurrence``. With b = w = β
    (broadcast) it is KDA."""
    return run(GDN2, "linrnn.ops.gdn2", q, k, v, dict(g=g, b=b, w=w), parse_options(options))


def ssd(q, k, v, g, beta, **options):
    """Mamba-2's state-space duality (SSD) recurrence: ``S_t = exp(g_t) S_{t−1} + β_t k_t v_tᵀ`` with g, beta
    ``[B, T, H]`` (Mamba-2: q = C, k = B, v = x, β = Δ ≥ 0, g = Δ·A). Options as in ``recurrence``; Mamba-2 uses
    ``scale=1``."""
    return run(SSD, "linrnn.ops.ssd", q, k, v, dict(g=g, beta=beta), parse_options(options))


def run(structure: Structure, op: str, q: Tensor, k: Tensor, v: Tensor, inputs: dict[str, Tensor | None],
        options: _Options | None = None) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """The op of a cell of this ``structure``: checks q, k, v and ``inputs`` (``structure.input_names()``, each
    required) and the options, then runs the recurrence. ``op`` names the caller in error messages."""
    options = options or _Options()
    expected = structure.input_names()
    unknown = sorted(set(inputs) - set(expected))
    if unknown:
        fail(op, f"got unexpected input {unknown[0]!r}; this op takes q, k, v, {', '.join(expected)}")
    _check(op, structure, q, k, v, inputs, options)
    values = {name: inputs[name] for name in expected}
    if options.check_values or options.backend == "reference":
        _check_values(op, structure, values)
    return _dispatch(op, structure, q, k, v, values, options)


def _check(op, structure, q, k, v, inputs, options):
    check_options(op, options.backend, options.chunk_size)
    check_tensor(op, "q", q, ["B", "T", "H", "K"], "[B, T, H, K]")
    batch, steps, heads, key_dim = q.shape
    if steps < 1:
        fail(op, f"argument 'q' must have at least one time step (T >= 1), got shape {list(q.shape)}")
    check_tensor(op, "k", k, [batch, steps, heads, key_dim], "[B, T, H, K]")
    check_tensor(op, "v", v, [batch, steps, heads, "V"], "[B, T, H, V]")
    sizes = {"B": batch, "T": steps, "H": heads, "K": key_dim, "V": v.shape[-1]}
    for name in structure.input_names():
        x = inputs.get(name)
        if x is None:
            fail(op, f"argument {name!r} ({INPUTS[name][1]}) is required, got None")
        shape = structure.shape(name)
        label = f"{shape} (per-{structure.decay} log-decay)" if name == "g" else shape
        check_tensor(op, name, x, [sizes[axis] for axis in shape.strip("[]").split(", ")], label)
    if "a" in inputs:
        check_same(op, {"q": q, "a": inputs["a"]}, "dtype")
    check_same(op, {"q": q, "k": k, "v": v}, "dtype")
    initial_state, cu_seqlens = options.initial_state, options.cu_seqlens
    check_same(op, {"q": q, "k": k, "v": v, **inputs, "initial_state": initial_state}, "device")
    sequences = batch if cu_seqlens is None else check_cu_seqlens(op, cu_seqlens, batch, steps, q.device)
    if initial_state is not None:
        expected = [sequences, heads, key_dim, v.shape[-1]]
        check_tensor(op, "initial_state", initial_state, expected, "[N, H, K, V] (N = B, or sequences in cu_seqlens)")
    if options.update_state_in_place:
        _check_state_buffer(op, initial_state, compute_dtype(q.dtype), (q, k, v, *inputs.values()))


def _check_values(op, structure, inputs):
    """Content checks (a device sync): finite inputs, g ≤ 0, beta and b in range, unit erase directions."""
    ranges = {"g": (None, 0.0), "beta": (0.0, 2.0 if structure.erase != "off" else None), "b": (0.0, 2.0),
              "w": (None, None), "log_gamma": (None, None)}  # fmt: skip
    for name, x in inputs.items():
        if name == "a":
            check_unit_rows(op, "a", x)
        else:
            check_range(op, name, x, *ranges[name], what="log-decay" if name == "g" else "")


def _check_state_buffer(op, state, dtype, tensors) -> None:
    """``update_state_in_place``: the initial state is the buffer the final state is written into."""
    if state is None:
        fail(op, "update_state_in_place=True needs argument 'initial_state' (the buffer to update), got None")
    if state.dtype not in (dtype, torch.bfloat16) or not state.is_contiguous():
        fail(op, f"update_state_in_place=True needs a contiguous {dtype} (or torch.bfloat16) 'initial_state', got "
                 f"{'a contiguous' if state.is_contiguous() else 'a non-contiguous'} {state.dtype} tensor")  # fmt: skip
    if _needs_grad((*tensors, state)):
        fail(op, "update_state_in_place=True is for inference: no input may require grad while autograd is on")


def _dispatch(op, structure, q, k, v, inputs, options):
    """Maps the structure's inputs onto the kernels' arguments (query q, write key w, value v, erase direction e,
    log-decay g, strength β, erase gate b, Γ) and picks the implementation. A write gate multiplies v, and a
    write strength without an erase multiplies w, before the kernels; Γ is folded inside the fused recurrent
    kernel and the chunkwise custom op, and here, in torch, for the reference."""
    g, beta, b, log_gamma = (inputs.get(name) for name in ("g", "beta", "b", "log_gamma"))
    w = k
    if "w" in inputs:
        v = v * inputs["w"].to(v.dtype)
    if structure.erase == "off" and beta is not None:  # β scales the write only: fold it into the write key
        w, beta = k * beta[..., None].to(k.dtype), None
    e = {"off": None, "tied": w, "decoupled": inputs.get("a")}[structure.erase]
    return _run_kernels(op, q, w, v, e, g, beta, options, log_gamma=log_gamma, erase_gate=b)


def _run_kernels(op, q, w, v, e, g, beta, options, log_gamma=None, erase_gate=None):
    args = dict(
        scale=q.shape[-1] ** -0.5 if options.scale is None else options.scale,
        initial_state=options.initial_state,
        output_final_state=options.output_final_state,
        cu_seqlens=options.cu_seqlens,
    )
    tensors = (q, w, v, e, g, beta, options.initial_state, log_gamma, erase_gate)
    use_triton = options.backend == "triton" or (options.backend == "auto" and q.is_cuda)
    if use_triton:
        problem = _triton_problem(tensors)
        if problem and options.backend == "triton":
            fail(op, f"backend 'triton' {problem}")
        use_triton = problem is None  # "auto" falls back to the torch path, saying so once per reason
        if problem and q.is_cuda and not torch.compiler.is_compiling():  # dynamo cannot trace warnings.warn
            _warn_fallback(op, problem)
    if options.chunk_size not in (None, TRITON_CHUNK) and (use_triton or options.backend == "reference"):
        where = "the Triton kernels use chunks of 64" if use_triton else "backend 'reference' is sequential"
        fail(op, f"argument 'chunk_size' must be None or {TRITON_CHUNK} here ({where}); got {options.chunk_size}; "
                 f"backend 'torch' takes any chunk size")  # fmt: skip
    if use_triton and not _needs_grad(tensors) and _longest(q, options.cu_seqlens) <= FUSED_RECURRENT_MAX_STEPS:
        from linrnn.kernels.triton.fused_recurrent import fused_recurrent_fwd

        if options.update_state_in_place:  # each program reads its state tile before it writes it
            return fused_recurrent_fwd(q, w, v, e, g, beta, erase_gate=erase_gate, log_gamma=log_gamma,
                                       final_state=args["initial_state"],
                                       **{**args, "output_final_state": True})  # fmt: skip
        return fused_recurrent_fwd(q, w, v, e, g, beta, erase_gate=erase_gate, log_gamma=log_gamma, **args)
    if options.update_state_in_place:
        o, final = _run_kernels(op, q, w, v, e, g, beta, replace(options, update_state_in_place=False,
                                output_final_state=True), log_gamma, erase_gate)  # fmt: skip
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
        o, final = recurrence_reference(q, w, v, e, g, beta, erase_gate=erase_gate, **args)
    else:  # the custom op (linrnn.kernels.library), which folds q and w itself: torch.compile traces through it
        o, final = chunk_recurrence(q, w, v, e, g, beta, backend="triton" if use_triton else "torch",
                                    chunk_size=options.chunk_size, fp32_accurate=out_dtype == torch.float32,
                                    log_gamma=log_gamma, erase_gate=erase_gate, **args)  # fmt: skip
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
