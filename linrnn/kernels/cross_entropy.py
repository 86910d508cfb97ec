"""Cross-entropy of a linear readout without the ``[tokens, vocab]`` fp32 logits: a ``torch.library`` custom op.

``linear_cross_entropy(hidden [N, D], weight [V, D], targets [N])`` is ``F.cross_entropy(multiplier · hidden @
weightᵀ + bias, targets, ignore_index=...)`` (mean over the targets that are not ``ignore_index``). The tokens go
through in chunks of ``chunk_tokens``; for each chunk the op forms the chunk's logits (in the inputs' dtype, then
fp32 for the softmax), its loss, and — when a gradient is wanted — the gradients of that chunk's loss with respect
to its hidden rows, the weight and the bias, right away. So at most one chunk of logits is alive, the forward
keeps no activations for the backward besides those gradients, and the backward only scales them by the incoming
gradient. Softmax, loss and the sums over chunks are fp32 (fp64 for fp64 weights). Per chunk with softmax ``p``
and one-hot targets ``y``: ``dz = p − y`` (zero for ignored tokens), ``d hidden = multiplier · dz @ W``,
``dW = multiplier · dzᵀ @ hidden``, ``d bias = Σ dz``. On CUDA the per-chunk softmax, loss and ``dz`` are one
Triton kernel over the chunk's logits in the inputs' dtype (``triton/cross_entropy.py``); elsewhere torch ops.
"""

from __future__ import annotations

import torch
from torch import Tensor

from linrnn.kernels import use_triton

CHUNK_BYTES = 256 << 20  # fp32 logits of one chunk: sets the tokens per chunk for a vocabulary


def _wide(dtype: torch.dtype) -> torch.dtype:
    """Softmax, loss and gradient sums: fp32, or fp64 for fp64 weights."""
    return torch.promote_types(dtype, torch.float32)


def _absent(like: Tensor) -> Tensor:
    return like.new_empty((0,))


@torch.library.custom_op("linrnn::linear_cross_entropy", mutates_args=())
def linear_cross_entropy_op(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    bias: Tensor | None,
    multiplier: float,
    ignore_index: int,
    chunk_tokens: int,
    with_grad: bool,
    fused_rows: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    tokens, wide = hidden.shape[0], _wide(weight.dtype)
    loss = torch.zeros((), dtype=wide, device=hidden.device)
    grad_hidden = torch.empty_like(hidden) if with_grad else _absent(hidden)
    grad_weight = torch.zeros(weight.shape, dtype=wide, device=weight.device) if with_grad else None
    grad_bias = torch.zeros(bias.shape, dtype=wide, device=bias.device) if with_grad and bias is not None else None
    for start in range(0, tokens, chunk_tokens):
        rows = hidden[start : start + chunk_tokens]  # [c, D]
        target = targets[start : start + chunk_tokens]
        if fused_rows:  # the softmax, loss and dz in one Triton kernel; dz overwrites the chunk's logits
            from linrnn.kernels.triton.cross_entropy import cross_entropy_rows

            logits = rows @ weight.T  # [c, V] in the inputs' dtype
            loss += cross_entropy_rows(logits, target, bias, multiplier, ignore_index, with_grad).sum().to(wide)
            if with_grad:
                if grad_bias is not None:
                    grad_bias += logits.sum(0, dtype=wide) / multiplier
                grad_hidden[start : start + chunk_tokens] = (logits @ weight).to(hidden.dtype)
                if logits.is_cuda and logits.dtype in (torch.bfloat16, torch.float16) and wide == torch.float32:
                    # the product accumulated into the fp32 sum by the GEMM (no [V, D] cast and add per chunk)
                    grad_weight = torch.addmm(grad_weight, logits.T, rows, out_dtype=wide)
                else:
                    grad_weight += (logits.T @ rows).to(wide)
            continue
        valid = target != ignore_index
        safe_target = torch.where(valid, target, 0)
        logits = (rows @ weight.T).to(wide) * multiplier  # [c, V]
        if bias is not None:
            logits += bias.to(wide)
        lse = torch.logsumexp(logits, dim=-1)
        picked = logits.gather(1, safe_target[:, None]).squeeze(1)
        loss += torch.where(valid, lse - picked, 0.0).sum()
        if not with_grad:
            continue
        dz = logits.sub_(lse[:, None]).exp_()  # softmax, in place of the logits
        dz[torch.arange(dz.shape[0], device=dz.device), safe_target] -= 1.0
        dz *= valid[:, None]
        if grad_bias is not None:
            grad_bias += dz.sum(0)
        dz_scaled = (dz * multiplier).to(weight.dtype)
        grad_hidden[start : start + chunk_tokens] = (dz_scaled @ weight).to(hidden.dtype)
        grad_weight += (dz_scaled.T @ rows).to(wide)
    if not with_grad:
        return loss, grad_hidden, _absent(weight), _absent(weight)
    grad_weight = grad_weight.to(weight.dtype)
    return loss, grad_hidden, grad_weight, _absent(weight) if grad_bias is None else grad_bias.to(bias.dtype)


@linear_cross_entropy_op.register_fake
def _(hidden, weight, targets, bias, multiplier, ignore_index, chunk_tokens, with_grad, fused_rows):
    loss = hidden.new_empty((), dtype=_wide(weight.dtype))
    if not with_grad:
        return loss, _absent(hidden), _absent(weight), _absent(weight)
    grad_bias = _absent(weight) if bias is None else bias.new_empty(bias.shape)
    return loss, hidden.new_empty(hidden.shape), weight.new_empty(weight.shape), grad_bias


def _setup_context(ctx, inputs, output):
    _, grad_hidden, grad_weight, grad_bias = output
    ctx.save_for_backward(grad_hidden, grad_weight, grad_bias)
    ctx.has_bias = inputs[3] is not None


def _backward(ctx, grad_loss, *_):
    grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
    if grad_hidden.numel() == 0 and grad_hidden.dim() == 1:
        raise RuntimeError("linear_cross_entropy: the forward ran without with_grad; no gradient was computed")
    scaled = [grad * grad_loss.to(grad.dtype) for grad in (grad_hidden, grad_weight)]
    bias_grad = grad_bias * grad_loss.to(grad_bias.dtype) if ctx.has_bias else None
    return scaled[0], scaled[1], None, bias_grad, None, None, None, None, None


linear_cross_entropy_op.register_autograd(_backward, setup_context=_setup_context)


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, *, bias: Tensor | None = None,
                         multiplier: float = 1.0, ignore_index: int = -100, reduction: str = "mean",
                         chunk_tokens: int | None = None, backend: str = "auto") -> Tensor:  # fmt: skip
    """Cross-entropy of ``multiplier · hidden @ weightᵀ + bias`` against ``targets`` (module docstring), the mean
    (``reduction="mean"``) or the sum (``"sum"``) over the targets that are not ``ignore_index``.
    hidden ``[..., D]``, targets ``[...]`` (int64), weight ``[V, D]``, bias ``[V]``. Under autocast the product
    runs in autocast's dtype, as ``nn.Linear`` would; the softmax and the loss are fp32. ``backend`` as the
    mixers' (``linrnn.kernels.use_triton``): the Triton rows kernel (``triton/cross_entropy.py``) or torch."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"linear_cross_entropy: argument 'reduction' must be 'mean' or 'sum', got {reduction!r}")
    if hidden.shape[:-1] != targets.shape:
        raise ValueError(f"linear_cross_entropy: argument 'targets' must have hidden's leading shape "
                         f"{list(hidden.shape[:-1])}, got {list(targets.shape)}")  # fmt: skip
    device_type = hidden.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    elif hidden.dtype != weight.dtype:
        hidden = hidden.to(weight.dtype)
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1).long()
    chunk_tokens = chunk_tokens or max(1, CHUNK_BYTES // (4 * weight.shape[0]))
    with_grad = torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (hidden, weight, bias))
    fused_rows = use_triton(hidden, backend) and multiplier != 0
    loss, *_ = linear_cross_entropy_op(hidden, weight, targets, bias, float(multiplier), ignore_index, chunk_tokens,
                                       with_grad, fused_rows)  # fmt: skip
    return loss if reduction == "sum" else loss / (targets != ignore_index).sum().clamp_min(1)
