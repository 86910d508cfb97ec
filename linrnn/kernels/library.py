"""The chunkwise recurrence as ``torch.library`` custom ops, so that ``torch.compile`` traces models through it.

Two ops, each with a fake (meta) implementation that gives only shapes and dtypes:

- ``linrnn::chunk_forward(q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate, ..., keep_states,
  keep_intra) -> (o, final_state, states, values, intra, write_keys)``
- ``linrnn::chunk_backward(do, d_final, <the forward's inputs>, states, values, intra, write_keys) -> (dq, dk, dw,
  dv, dg, dbeta, d_initial, d_log_gamma, d_erase_gate)``

registered as each other's autograd (``register_autograd``). ``chunk_recurrence`` calls the forward op under
``torch.compile`` only; eager calls run the same two implementations and autograd as a plain
``torch.autograd.Function`` (``_EagerChunk``), without the dispatcher's host time. Arguments follow
``triton.chunk.chunk_forward``: ``k`` is the erase direction (the write key too when ``w`` is None), ``w`` a
decoupled write key, ``erase=False`` drops the erase term, ``erase_gate`` (b) gates the erase per key channel (it
reads the state along ``b ⊙ k``).
``backend`` is ``"torch"`` (``chunked.recurrence_chunked``) or ``"triton"``.

The backward recomputes what it needs from the inputs instead of the forward saving its intermediates, with one
exception: the Triton forward with ``keep_states`` (what ``chunk_recurrence`` asks for when autograd records) also
returns the chunk start states ``[rows, H, K, V]`` and, with erase, the corrected values ``U`` ``[B·T, H, V]`` in
the inputs' dtype, and the backward reuses them. Those come from the sequential state pass, the one launch whose
time grows with the sequence length rather than the batch (at 1×16384 with 6 heads it has 96 programs walking 256
chunks); the parallel launches (decay cumsums, intra-chunk matrices, the block solve) rerun in the backward, and
the output kernel too where it forms ``A_qk`` (per-head decay, and DeltaNet's ``triton.chunk.fused_path``). With
``keep_intra`` as well (``KEEP_INTRA``) the forward also returns its intra-chunk matrices ``[B·T, H, 64]`` one after
the other in a byte buffer (fp32, A_qk in the inputs' dtype; ``triton.chunk.intra_views``) and, with erase off the
fused path (``triton.chunk.fused_path``), the scaled erase keys ``W_s`` ``[B·T, H, K]``, and the backward reruns
only the decay cumsums (on the fused path, whose forward forms no W_s, also W_s from the kept T). ``keep_intra``
without ``keep_states`` keeps those and, off the fused path, the solve's ``U_v`` (in the values' place): the
backward reruns only the state pass. The torch backward reruns the chunked forward under ``torch.func.vjp``.

GammaNet (``log_gamma``): the ops run the kernels on ``Γq`` and ``Γ⁻¹w`` in the inputs' dtype (bf16 under autocast)
and the backward goes back through the fold from the kernels' fp32 gradients of those two (inside the last
backward kernel on the Triton path with per-channel decay). ``d log Γ = Σ Γq ⊙ d(Γq) − Γ⁻¹w ⊙ d(Γ⁻¹w)``
is a difference of nearly cancelling sums (without the erase it is exactly zero: Γ would cancel between query and
key), so it is formed from unrounded gradients times the rounded operands the kernels used: the symmetry behind the
cancellation holds at that rounded point, and unrounded operands beside gradients taken there double the error
(``experiments/gammanet_fold_rounding.py``).

Custom ops return tensors only: an absent final state or gradient is a tensor with no elements, mapped back to None
by the wrappers. ``cu_seqlens`` stays an opaque tensor argument (its values set the kernels' grids), so packed
sequences cost no data-dependent shapes in a compiled graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linrnn.kernels.chunked import recurrence_chunked
from linrnn.kernels.reference import compute_dtype

_NOTHING = (0,)  # shape of the stand-in for an absent tensor
# the Triton forward keeps its chunk states and corrected values for the backward when autograd records (module
# docstring); False reruns the state pass in the backward instead (less activation memory, one more sequential pass)
KEEP_STATES = True
# also keep the intra-chunk matrices (and off the fused path W_s, and U_v where the states are not kept) for the
# backward: "never", "decoupled" (only with a decoupled write key) or "always": ~100 MB a layer at the 340M GDN's 16k
# tokens, a ~3% faster step (H100)
KEEP_INTRA = "always"


def _absent(like: Tensor) -> Tensor:
    return like.new_empty(_NOTHING)


def _contiguous(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.contiguous()


def _present(x: Tensor | None) -> Tensor | None:
    return None if x is None or x.numel() == 0 and x.dim() == 1 else x


def _chunk_forward(
    q: Tensor,
    k: Tensor,
    w: Tensor | None,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    log_gamma: Tensor | None,
    erase_gate: Tensor | None,
    erase: bool,
    scale: float,
    output_final_state: bool,
    fp32_accurate: bool,
    backend: str,
    chunk_size: int,
    keep_states: bool,
    keep_intra: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    if log_gamma is not None:
        q, w, _ = fold(q, w, log_gamma, backend)
    states = values = intra = write_keys = None
    if backend == "triton":
        from linrnn.kernels.triton.chunk import chunk_forward, value_rows

        # v read in place when it is a column block of the short conv's output
        args = [value_rows(x) if x is v else _contiguous(x) for x in (q, k, w, v, g, beta, initial_state)]
        o, final, saved = chunk_forward(*args[:6], erase=erase, scale=scale, initial_state=args[6],
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                        fp32_accurate=fp32_accurate, read=read_vector(k, erase_gate),
                                        keep_u_v=keep_intra and not keep_states)  # fmt: skip
        if keep_states:
            states, values = saved["states"], saved["U"]
        if keep_intra:
            intra, write_keys = saved["intra"], saved["W_s"]
            if not keep_states:  # the backward reruns the state pass from the solve's U_v
                values = saved["U_v"]
    else:
        o, final = _torch_forward(q, k, w, v, g, beta, initial_state, erase_gate, cu_seqlens, erase, scale,
                                  output_final_state, chunk_size)  # fmt: skip
    final = final.contiguous() if final is not None else None  # the fake's layout
    return o.contiguous(), *(_absent(o) if x is None else x for x in (final, states, values, intra, write_keys))


chunk_forward_op = torch.library.custom_op("linrnn::chunk_forward", _chunk_forward, mutates_args=())


def read_vector(k: Tensor, erase_gate: Tensor | None) -> Tensor | None:
    """``b ⊙ k`` in k's dtype (a Triton operand, formed in fp32), the vector a gated erase reads the state along;
    None without a gate."""
    if erase_gate is None:
        return None
    return (k.float() * erase_gate.float()).to(k.dtype).contiguous()


def _torch_forward(q, k, w, v, g, beta, initial_state, erase_gate, cu_seqlens, erase, scale, output_final_state,
                   chunk_size):  # fmt: skip
    write_key = k if w is None else w
    erase_direction = (write_key if w is None else k) if erase else None  # the same tensor marks the tied case
    return recurrence_chunked(q, write_key, v, erase_direction, g, beta, erase_gate=erase_gate, scale=scale,
                              initial_state=initial_state, output_final_state=output_final_state,
                              cu_seqlens=cu_seqlens, chunk_size=chunk_size or None)  # fmt: skip


def fold(q: Tensor, w: Tensor, log_gamma: Tensor, backend: str = "torch") -> tuple[Tensor, Tensor, Tensor]:
    """GammaNet's fold of the query and the write key: ``(Γq, Γ⁻¹w)`` computed in at least fp32 and returned in
    q's and w's dtypes (the kernels' operands), and ``Γ = exp(log_gamma)`` ``[H, K]`` in that wider dtype. On the
    Triton path one launch (``triton.fused.fold_forward``)."""
    gamma = log_gamma.to(compute_dtype(q.dtype)).exp()
    if backend == "triton":
        from linrnn.kernels.triton.fused import fold_forward

        return *fold_forward(q.contiguous(), w.contiguous(), gamma.contiguous()), gamma
    return (q.to(gamma.dtype) * gamma).to(q.dtype), (w.to(gamma.dtype) / gamma).to(w.dtype), gamma


@chunk_forward_op.register_fake
def _(q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate, erase, scale, output_final_state,
      fp32_accurate, backend, chunk_size, keep_states, keep_intra):  # fmt: skip
    o = v.new_empty(v.shape)
    (batch, steps, heads, key_dim), value_dim = q.shape, v.shape[3]
    sequences = None if cu_seqlens is None else cu_seqlens.shape[0] - 1
    final, states, values, intra, write_keys = (_absent(o) for _ in range(5))  # the real op's do not alias
    if output_final_state:
        state_dtype = compute_dtype(q.dtype) if backend == "torch" else torch.float32
        final = q.new_empty((batch if sequences is None else sequences, heads, key_dim, value_dim), dtype=state_dtype)
    if backend == "triton":
        from linrnn.kernels.triton.chunk import fused_path, intra_bytes, intra_names, state_rows

        # the fused path's forward forms neither W_s nor U_v (its state pass works from T)
        fused = fused_path(erase, w is not None, erase_gate is not None, g is not None and g.dim() == 4, key_dim)
        if keep_states:
            states = q.new_empty((state_rows(batch, steps, sequences), heads, key_dim, value_dim))
        if erase and (keep_states or keep_intra and not fused):
            values = v.new_empty((batch * steps, heads, value_dim))
        if keep_intra:
            names = intra_names(erase, w is not None, fused)
            intra = q.new_empty((intra_bytes(names, q.dtype, batch * steps, heads),), dtype=torch.uint8)
            if erase and not fused:
                write_keys = q.new_empty((batch * steps, heads, key_dim))
    return o, final, states, values, intra, write_keys


def _chunk_backward(
    do: Tensor,
    d_final: Tensor,
    q: Tensor,
    k: Tensor,
    w: Tensor | None,
    v: Tensor,
    g: Tensor | None,
    beta: Tensor | None,
    initial_state: Tensor | None,
    cu_seqlens: Tensor | None,
    log_gamma: Tensor | None,
    erase_gate: Tensor | None,
    erase: bool,
    scale: float,
    fp32_accurate: bool,
    backend: str,
    chunk_size: int,
    states: Tensor,
    values: Tensor,
    intra: Tensor,
    write_keys: Tensor,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    d_final = _present(d_final)
    d_erase_gate = None
    folded_q, folded_w, d_log_gamma = q, w, None
    if log_gamma is not None:
        folded_q, folded_w, gamma = fold(q, w, log_gamma, backend)
    if backend == "triton":
        from linrnn.kernels.triton.chunk import chunk_backward, chunk_forward, value_rows

        args = [value_rows(x) if x is v else _contiguous(x) for x in (folded_q, k, folded_w, v, g, beta, initial_state)]
        states = _present(states)
        kept = dict(states=states, intra=_present(intra), W_s=_present(write_keys))
        kept["U" if states is not None else "U_v"] = _present(values)
        read = read_vector(k, erase_gate)
        _, _, saved = chunk_forward(*args[:6], erase=erase, scale=scale, initial_state=args[6],
                                    output_final_state=False, cu_seqlens=cu_seqlens, fp32_accurate=fp32_accurate,
                                    need_output=False, kept=kept, read=read)  # fmt: skip
        fold_args = None if log_gamma is None else (gamma.contiguous(), (q.dtype, w.dtype))
        *grads, d_log_gamma, d_read = chunk_backward(do, d_final, *args, saved, erase=erase, scale=scale,
                                                     fold=fold_args, read=read)  # fmt: skip
        if read is not None:  # r = b ⊙ k: dk += b ⊙ dr, db = k ⊙ dr (dk comes in fp32 then)
            grads[1] = (grads[1] + d_read * erase_gate.float()).to(k.dtype)
            d_erase_gate = (d_read * k.float()).to(erase_gate.dtype)
        grads = [*grads[:-1], None if grads[-1] is None else grads[-1].to(initial_state.dtype)]
    else:
        if log_gamma is not None:  # the same operand values in the wider dtype: their gradients come out wide
            folded_q, folded_w = folded_q.to(gamma.dtype), folded_w.to(gamma.dtype)
        *grads, d_erase_gate = _torch_backward(do, d_final, folded_q, k, folded_w, v, g, beta, initial_state,
                                               erase_gate, cu_seqlens, erase, scale, chunk_size)  # fmt: skip
    if log_gamma is not None and backend == "triton":  # chunk_backward went back through the fold (as below)
        d_log_gamma = d_log_gamma.to(log_gamma.dtype)
    elif log_gamma is not None:  # back through the fold, in the wide dtype: d log Γ = Σ Γq ⊙ d(Γq) − Γ⁻¹w ⊙ d(Γ⁻¹w)
        d_folded_q, d_folded_w = grads[0].to(gamma.dtype), grads[2].to(gamma.dtype)
        # the operands as the kernels saw them (rounded): the sums cancel nearly exactly at that point, not beside it
        d_log_gamma = (folded_q.to(gamma.dtype) * d_folded_q - folded_w.to(gamma.dtype) * d_folded_w).sum((0, 1))
        d_log_gamma = d_log_gamma.to(log_gamma.dtype)
        grads = [(d_folded_q * gamma).to(q.dtype), grads[1], (d_folded_w / gamma).to(w.dtype), *grads[3:]]
    return tuple(_absent(do) if grad is None else grad.contiguous() for grad in (*grads, d_log_gamma, d_erase_gate))


chunk_backward_op = torch.library.custom_op("linrnn::chunk_backward", _chunk_backward, mutates_args=())


def _torch_backward(do, d_final, q, k, w, v, g, beta, initial_state, erase_gate, cu_seqlens, erase, scale,
                    chunk_size):  # fmt: skip
    """The chunked forward again, differentiated against ``do`` and ``d_final`` (``torch.func.vjp``: the op runs
    below autograd, where a plain ``torch.autograd.grad`` would find nothing recorded)."""
    inputs = (q, k, w, v, g, beta, initial_state, erase_gate)
    present = [i for i, x in enumerate(inputs) if x is not None]

    def forward(*tensors):
        full = list(inputs)
        for i, x in zip(present, tensors, strict=True):
            full[i] = x
        o, final = _torch_forward(*full, cu_seqlens, erase, scale, d_final is not None, chunk_size)
        return (o, final) if d_final is not None else (o,)

    outputs, vjp = torch.func.vjp(forward, *(inputs[i] for i in present))
    cotangents = (do, d_final.to(outputs[1].dtype)) if d_final is not None else (do,)
    grads = iter(vjp(cotangents))
    return [None if x is None else next(grads) for x in inputs]


@chunk_backward_op.register_fake
def _(do, d_final, q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate, erase, scale,
      fp32_accurate, backend, chunk_size, states, values, intra, write_keys):  # fmt: skip
    inputs = (q, k, w, v, g, beta, initial_state, log_gamma, erase_gate)
    return tuple(_absent(do) if x is None else x.new_empty(x.shape) for x in inputs)


def _setup_context(ctx, inputs, output):
    (q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate, erase, scale, _, fp32_accurate, backend,
     chunk_size, _, _) = inputs  # fmt: skip
    _, _, states, values, intra, write_keys = output
    # the kept tensors carry no gradient: without this, autograd would fill zeros of their size for the backward
    # (~0.8 GB a call at 8×4096 with H = 16), and of o or the final state where the loss does not use them
    ctx.mark_non_differentiable(states, values, intra, write_keys)
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate, states, values,
                          intra, write_keys)  # fmt: skip
    ctx.options = (erase, scale, fp32_accurate, backend, chunk_size)


def _backward(ctx, do, d_final, *_d_kept, backward=chunk_backward_op):
    q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate, *kept = ctx.saved_tensors
    if do is None:  # only the final state reaches the loss
        do = v.new_zeros(v.shape)
    if d_final is None or d_final.numel() == 0:
        d_final = _absent(do)
    grads = backward(do.contiguous(), d_final.contiguous(), q, k, w, v, g, beta, initial_state, cu_seqlens, log_gamma,
                     erase_gate, *ctx.options, *kept)  # fmt: skip
    *grads, d_log_gamma, d_erase_gate = [_present(grad) for grad in grads]
    return (*grads, None, d_log_gamma, d_erase_gate, *([None] * 8))  # cu_seqlens and the options get no gradient


chunk_forward_op.register_autograd(_backward, setup_context=_setup_context)


class _EagerChunk(torch.autograd.Function):
    """The two ops' implementations and autograd without the dispatcher, for calls outside ``torch.compile``: the
    custom op's dispatch, argument defaults and aliasing checks cost more host time per call than the forward's
    kernel launches (the H100 machine, torch 2.11: a GDN forward at 1 × 64 tokens took 954 µs with them, 362 µs
    without them and with the launch sizes computed on the host)."""

    @staticmethod
    def forward(ctx, *inputs):
        outputs = _chunk_forward(*inputs)
        _setup_context(ctx, inputs, outputs)
        return outputs

    @staticmethod
    def backward(ctx, do, d_final, *d_kept):
        return _backward(ctx, do, d_final, *d_kept, backward=_chunk_backward)


def chunk_recurrence(q, w, v, e, g, beta, *, scale, initial_state=None, output_final_state=False, cu_seqlens=None,
                     backend="torch", chunk_size=None, fp32_accurate=True, log_gamma=None,
                     erase_gate=None):  # fmt: skip
    """``recurrence_reference``'s arguments and results (``e is w``: tied erase; None: no erase) through the custom
    op, with autograd. Inputs must be validated already (``linrnn.ops`` does). ``log_gamma`` ``[H, K]``: run on
    ``Γq`` and ``Γ⁻¹w`` (``fold``; an erase direction ``e`` is required), the states as given — GammaNet's op folds
    them around this call."""
    erase_direction, write_key = (w, None) if e is None or e is w else (e, w)  # the ops' k and w
    if log_gamma is not None:  # the fold decouples the write key Γ⁻¹w from the erase direction e, even if e is w
        if e is None:
            raise ValueError("chunk_recurrence: log_gamma needs an erase direction e, got None")
        erase_direction, write_key = e, w
    if cu_seqlens is not None and cu_seqlens.dtype != torch.int64:
        cu_seqlens = cu_seqlens.long()
    inputs = (q, w, v, e, g, beta, initial_state, log_gamma, erase_gate)
    records = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in inputs)
    keep_states = KEEP_STATES and records and backend == "triton"
    keep_intra = (records and backend == "triton"
                  and (KEEP_INTRA == "always" or KEEP_INTRA == "decoupled" and write_key is not None))  # fmt: skip
    run = chunk_forward_op if torch.compiler.is_compiling() else _EagerChunk.apply  # the same op, one traced
    o, final, *_ = run(q, erase_direction, write_key, v, g, beta, initial_state, cu_seqlens, log_gamma, erase_gate,
                       e is not None, float(scale), output_final_state, fp32_accurate, backend, chunk_size or 0,
                       keep_states, keep_intra)  # fmt: skip
    return o, final if output_final_state else None
