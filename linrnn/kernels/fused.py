"""The model's fused pieces: the blocks' residual add + RMSNorm, the mixers' gated RMSNorm and key-stream L2 norm,
and the MLP's SwiGLU product.

- ``rms_norm(x, weight, eps, delta=None)``: ``RMSNorm(x + delta) · weight`` over the last dim; with ``delta`` it
  also returns the sum (the residual stream goes on from it).

- ``gated_rms_norm(x, z, weight, eps, gate="silu")``: per head, ``RMSNorm(x) · weight · SiLU(z)`` (or ``sigmoid(z)``,
  FLA's KDA) over the last dim of
  ``[B, T, H, D]`` (fp32 arithmetic, x's dtype out).
- ``l2_normalize(x, eps, dtype)``: ``x / sqrt(‖x‖² + eps)`` over the last dim, in ``dtype`` (FLA's in-kernel q, k
  norm; smooth at 0, unlike ``F.normalize``'s ``x / max(‖x‖, eps)``).
- ``swiglu(both)``: ``SiLU(a) · b`` for ``both = [a | b]`` (the MLP's one gate + up product; the backward
  writes its gradient as one tensor, as the product's backward reads it).
- ``mamba_log_decay(pre, a_log, dt_bias)``: GDN's and KDA's log-decay gate (one Triton kernel when decoding), and
  ``mamba_gates`` with their write strength β from the same launch.

``backend`` as the mixers': with "triton", and with "auto" on CUDA (not fp64), all run Triton kernels
(``triton/fused.py``) as ``torch.library`` custom ops whose backward recomputes from the inputs, so autograd
keeps only the inputs alive (the unfused eager form keeps several fp32 intermediates per layer); otherwise the same
math in torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from linrnn.kernels import heads_dense, rows_at_one_stride, use_triton


def rms_norm(x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None,
             backend: str = "auto") -> Tensor | tuple[Tensor, Tensor]:  # fmt: skip
    """x ``[..., D]`` (the residual stream), delta (a block's output, added first) → the normalised rows in the
    dtype the next GEMM reads (autocast's when it is on, else x's) — and ``x + delta`` in x's dtype when ``delta``
    is given. The torch path is ``F.rms_norm`` (its output dtype is autocast's choice)."""
    if use_triton(x, backend):
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        if delta is None:
            return rms_norm_op(x, weight, eps, dtype)
        return add_rms_norm_op(x, delta, weight, eps, dtype)
    total = x if delta is None else x + delta
    normed = F.rms_norm(total, (x.shape[-1],), weight, eps)
    return normed if delta is None else (normed, total)


def gated_rms_norm(x: Tensor, z: Tensor, weight: Tensor, eps: float, backend: str = "auto", gate: str = "silu"
                   ) -> Tensor:  # fmt: skip
    """x, z ``[B, T, H, D]``, weight ``[D]`` → ``[B, T, H, D]`` in x's dtype (see the module docstring); ``gate``
    is "silu" (SiLU(z)) or "sigmoid" (sigmoid(z))."""
    if gate not in GATES:
        raise ValueError(f"gated_rms_norm: argument 'gate' must be one of {GATES}, got {gate!r}")
    if use_triton(x, backend) and z.dtype == x.dtype:
        return gated_rms_norm_op(x, z, weight, eps, gate)
    return gated_rms_norm_torch(x, z, weight, eps, gate)


GATES = ("silu", "sigmoid")


def gated_rms_norm_torch(x: Tensor, z: Tensor, weight: Tensor, eps: float, gate: str = "silu") -> Tensor:
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps) * weight.to(wide.dtype)
    z = z.to(wide.dtype)
    return (normed * (z.sigmoid() if gate == "sigmoid" else F.silu(z))).to(x.dtype)


def l2_normalize(x: Tensor, eps: float, dtype: torch.dtype, backend: str = "auto") -> Tensor:
    """``x / sqrt(‖x‖² + eps)`` over the last dim, computed in at least fp32, returned in ``dtype``."""
    if use_triton(x, backend):
        return l2_normalize_op(x, eps, dtype)
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(wide.square().sum(-1, keepdim=True) + eps)).to(dtype)


def swiglu(both: Tensor, backend: str = "auto") -> Tensor:
    """``SiLU(a) · b`` ``[..., C]`` for ``both`` ``[..., 2C]`` = ``[a | b]``."""
    if both.shape[-1] % 2:
        raise ValueError(f"swiglu: argument 'both' must have an even last dim, got shape {list(both.shape)}")
    if use_triton(both, backend):
        return swiglu_op(both)
    a, b = both.chunk(2, dim=-1)
    return F.silu(a) * b


def mamba_log_decay(pre: Tensor, a_log: Tensor, dt_bias: Tensor, backend: str = "auto") -> Tensor:
    """``g = −exp(A_log) · softplus(pre + dt_bias)`` in at least fp32: pre ``[..., C]`` or ``[..., H, K]``, dt_bias
    of pre's trailing shape, a_log ``[H]`` (per head) or ``[H, 1]`` (per channel). Without autograd (decoding) and
    outside torch.compile, on the Triton path: one kernel."""
    if _one_launch(pre, dt_bias, backend, (pre, a_log, dt_bias)):
        return _log_decay_launch(pre, a_log, dt_bias)[0]
    pre = pre.to(torch.promote_types(pre.dtype, torch.float32))
    return -a_log.to(pre.dtype).exp() * F.softplus(pre + dt_bias.to(pre.dtype))


def mamba_gates(pre: Tensor, a_log: Tensor, dt_bias: Tensor, beta_pre: Tensor, beta_scale: float = 1.0,
                backend: str = "auto") -> tuple[Tensor, Tensor]:  # fmt: skip
    """(``mamba_log_decay(pre, a_log, dt_bias)``, ``β = beta_scale · sigmoid(beta_pre)``), both in at least fp32,
    for beta_pre ``[B, T, H]`` beside pre ``[B, T, ...]``. Where the log-decay is one kernel (decoding), β comes
    from the same launch instead of a cast and a sigmoid."""
    if _one_launch(pre, dt_bias, backend, (pre, a_log, dt_bias, beta_pre)) and beta_pre.stride(-1) == 1:
        return _log_decay_launch(pre, a_log, dt_bias, beta_pre, beta_scale)
    g = mamba_log_decay(pre, a_log, dt_bias, backend)
    beta = beta_pre.to(torch.promote_types(beta_pre.dtype, torch.float32)).sigmoid()
    return g, beta if beta_scale == 1 else beta_scale * beta


@dataclass
class MambaGateColumns:
    """Columns of a product that are the pre-activations of a Mamba-style decay (``[decay_start, decay_start +
    len(dt_bias))``, ``a_log`` per group of ``len(dt_bias) / len(a_log)`` of them, ``dt_bias`` per column) and of a
    write strength (``[beta_start, beta_start + beta_columns)``): ``linear`` sets ``g`` and ``beta`` (fp32, the
    product's leading dims) where the matrix-vector kernel computes them with the product, as ``mamba_gates``
    would from it; they stay None otherwise."""

    decay_start: int
    a_log: Tensor
    dt_bias: Tensor
    beta_start: int
    beta_columns: int
    beta_scale: float = 1.0
    g: Tensor | None = None
    beta: Tensor | None = None


def _one_launch(pre: Tensor, dt_bias: Tensor, backend: str, inputs: tuple[Tensor, ...]) -> bool:
    """Whether the log-decay kernel applies: the Triton path, no autograd, outside torch.compile, and pre's rows
    readable at one stride (a column slice of the projection is)."""
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
    trailing = dt_bias.dim()
    return (use_triton(pre, backend) and not needs_grad and not torch.compiler.is_compiling()
            and pre.stride(-1) == 1 and (trailing == 1 or pre.stride(-2) == pre.shape[-1]))  # fmt: skip


def _log_decay_launch(pre: Tensor, a_log: Tensor, dt_bias: Tensor, beta_pre: Tensor | None = None,
                      beta_scale: float = 1.0) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    from linrnn.kernels.triton.fused import log_decay_forward

    columns = dt_bias.numel()
    rows = pre.reshape(-1, columns)  # a view for a column slice of the projection (its rows keep their stride)
    beta_rows = None if beta_pre is None else beta_pre.reshape(rows.shape[0], -1)
    g, beta = log_decay_forward(rows, a_log.contiguous(), dt_bias.contiguous(), beta_rows, beta_scale)
    return g.view(pre.shape), None if beta is None else beta.view(beta_pre.shape)


def _token_rows(x: Tensor) -> tuple[Tensor, int, int]:
    """(x, rows per token, token stride) for the row kernels: ``[B, T, H, D]`` through ``heads_dense``, any other
    shape contiguous (one row per token)."""
    if x.dim() == 4:
        x = heads_dense(x)
        return x, x.shape[2], x.stride(1)
    x = x.contiguous()
    return x, 1, x.shape[-1]


@torch.library.custom_op("linrnn::gated_rms_norm", mutates_args=())
def gated_rms_norm_op(x: Tensor, z: Tensor, weight: Tensor, eps: float, gate: str) -> Tensor:
    from linrnn.kernels.triton.fused import gated_rms_norm_forward

    return gated_rms_norm_forward(heads_dense(x), heads_dense(z), weight.contiguous(), eps, gate)


@gated_rms_norm_op.register_fake
def _(x, z, weight, eps, gate):
    return x.new_empty(x.shape)


@torch.library.custom_op("linrnn::gated_rms_norm_backward", mutates_args=())
def gated_rms_norm_backward_op(dy: Tensor, x: Tensor, z: Tensor, weight: Tensor, eps: float,
                               gate: str) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    from linrnn.kernels.triton.fused import gated_rms_norm_backward

    dx, dz, dw = gated_rms_norm_backward(dy.contiguous(), heads_dense(x), heads_dense(z), weight.contiguous(), eps,
                                         gate)  # fmt: skip
    return dx, dz, dw.to(weight.dtype)


@gated_rms_norm_backward_op.register_fake
def _(dy, x, z, weight, eps, gate):
    return x.new_empty(x.shape), z.new_empty(z.shape), weight.new_empty(weight.shape)


def _norm_setup(ctx, inputs, output):
    x, z, weight, eps, gate = inputs
    ctx.save_for_backward(x, z, weight)
    ctx.eps, ctx.gate = eps, gate


def _norm_backward(ctx, dy):
    x, z, weight = ctx.saved_tensors
    dx, dz, dw = gated_rms_norm_backward_op(dy, x, z, weight, ctx.eps, ctx.gate)
    return dx, dz, dw, None, None


gated_rms_norm_op.register_autograd(_norm_backward, setup_context=_norm_setup)


@torch.library.custom_op("linrnn::swiglu", mutates_args=())
def swiglu_op(both: Tensor) -> Tensor:
    from linrnn.kernels.triton.fused import swiglu_forward

    return swiglu_forward(_rows_in_place(both))


@swiglu_op.register_fake
def _(both):
    return both.new_empty((*both.shape[:-1], both.shape[-1] // 2))


@torch.library.custom_op("linrnn::swiglu_backward", mutates_args=())
def swiglu_backward_op(dy: Tensor, both: Tensor) -> Tensor:
    from linrnn.kernels.triton.fused import swiglu_backward

    return swiglu_backward(dy.contiguous(), _rows_in_place(both))


@swiglu_backward_op.register_fake
def _(dy, both):
    return both.new_empty(both.shape)


def _rows_in_place(x: Tensor) -> Tensor:
    """x itself where its rows are at one stride (``rows_at_one_stride``: a column slice of a product), else a
    contiguous copy."""
    return x if rows_at_one_stride(x) else x.contiguous()


def _swiglu_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _swiglu_backward(ctx, dy):
    return swiglu_backward_op(dy, *ctx.saved_tensors)


swiglu_op.register_autograd(_swiglu_backward, setup_context=_swiglu_setup)


@torch.library.custom_op("linrnn::l2_normalize", mutates_args=())
def l2_normalize_op(x: Tensor, eps: float, dtype: torch.dtype) -> Tensor:
    from linrnn.kernels.triton.fused import l2_norm_forward

    x, heads, token_stride = _token_rows(x)
    return l2_norm_forward(x, eps, dtype, heads, token_stride)


@l2_normalize_op.register_fake
def _(x, eps, dtype):
    return x.new_empty(x.shape, dtype=dtype)


@torch.library.custom_op("linrnn::l2_normalize_backward", mutates_args=())
def l2_normalize_backward_op(dy: Tensor, x: Tensor, eps: float) -> Tensor:
    from linrnn.kernels.triton.fused import l2_norm_backward

    x, heads, token_stride = _token_rows(x)
    return l2_norm_backward(dy.contiguous(), x, eps, heads, token_stride)


@l2_normalize_backward_op.register_fake
def _(dy, x, eps):
    return x.new_empty(x.shape)


def _l2_setup(ctx, inputs, output):
    x, eps, _ = inputs
    ctx.save_for_backward(x)
    ctx.eps = eps


def _l2_backward(ctx, dy):
    (x,) = ctx.saved_tensors
    return l2_normalize_backward_op(dy, x, ctx.eps), None, None


l2_normalize_op.register_autograd(_l2_backward, setup_context=_l2_setup)


@torch.library.custom_op("linrnn::rms_norm", mutates_args=())
def rms_norm_op(x: Tensor, weight: Tensor, eps: float, dtype: torch.dtype) -> Tensor:
    from linrnn.kernels.triton.fused import rms_norm_forward

    return rms_norm_forward(x.contiguous(), None, weight.contiguous(), eps, dtype)[0]


@rms_norm_op.register_fake
def _(x, weight, eps, dtype):
    return x.new_empty(x.shape, dtype=dtype)


@torch.library.custom_op("linrnn::add_rms_norm", mutates_args=())
def add_rms_norm_op(x: Tensor, delta: Tensor, weight: Tensor, eps: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    from linrnn.kernels.triton.fused import rms_norm_forward

    return rms_norm_forward(x.contiguous(), delta.contiguous(), weight.contiguous(), eps, dtype)


@add_rms_norm_op.register_fake
def _(x, delta, weight, eps, dtype):
    return x.new_empty(x.shape, dtype=dtype), x.new_empty(x.shape)


@torch.library.custom_op("linrnn::rms_norm_backward", mutates_args=())
def rms_norm_backward_op(dy: Tensor, ds: Tensor | None, s: Tensor, weight: Tensor, eps: float,
                         delta_dtype: torch.dtype | None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The gradients of x, delta (empty without delta) and weight, from those of y and (with delta) of s."""
    from linrnn.kernels.triton.fused import rms_norm_backward

    ds = None if ds is None else ds.contiguous()
    dx, d_delta, dw = rms_norm_backward(dy.contiguous(), ds, s, weight.contiguous(), eps, delta_dtype)
    return dx, s.new_empty((0,)) if d_delta is None else d_delta, dw.to(weight.dtype)


@rms_norm_backward_op.register_fake
def _(dy, ds, s, weight, eps, delta_dtype):
    d_delta = s.new_empty((0,)) if delta_dtype is None else s.new_empty(s.shape, dtype=delta_dtype)
    return s.new_empty(s.shape), d_delta, weight.new_empty(weight.shape)


def _rms_setup(ctx, inputs, output):
    x, weight, eps, _ = inputs
    ctx.save_for_backward(x.contiguous(), weight)
    ctx.eps = eps


def _rms_backward(ctx, dy):
    x, weight = ctx.saved_tensors
    dx, _, dw = rms_norm_backward_op(dy, None, x, weight, ctx.eps, None)
    return dx, dw, None, None


rms_norm_op.register_autograd(_rms_backward, setup_context=_rms_setup)


def _add_rms_setup(ctx, inputs, output):
    _, delta, weight, eps, _ = inputs
    ctx.save_for_backward(output[1], weight)  # s = x + delta: the only activation kept
    ctx.eps, ctx.delta_dtype = eps, delta.dtype


def _add_rms_backward(ctx, dy, ds):
    s, weight = ctx.saved_tensors
    dx, d_delta, dw = rms_norm_backward_op(dy, ds, s, weight, ctx.eps, ctx.delta_dtype)
    return dx, d_delta, dw, None, None


add_rms_norm_op.register_autograd(_add_rms_backward, setup_context=_add_rms_setup)
