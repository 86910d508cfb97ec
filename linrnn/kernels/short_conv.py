"""Causal depthwise short convolution + SiLU of the mixers' q, k, v (and extra key) streams.

``short_conv(x, weight, history, offset)``: x ``[B, T, C]``, weight ``[C, 1, W]``, history ``[B, C, W − 1]`` (the
last ``W − 1`` inputs before x, oldest first) or None for zeros, offset ``[T]`` (each token's index within its
packed document, B = 1) or None. Returns SiLU(conv) ``[B, T, C]``. With ``offset``, taps reaching before a
document's start read 0 (and the history is not read).

``short_conv_pieces(x, weight, widths, ...)`` returns the output split along the channels into the mixer's streams,
each its own tensor on the Triton path. ``short_conv_step`` is the decoding form: one token, the history advanced
in place.

Two paths with the same result: ``triton`` (CUDA; ``linrnn::short_conv`` custom op with a registered backward and
fake implementation, so ``torch.compile`` keeps it whole) and ``torch`` (``conv1d``, everywhere else).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from linrnn.kernels import use_triton
from linrnn.kernels.fused import l2_normalize


def short_conv(x: Tensor, weight: Tensor, history: Tensor | None = None, offset: Tensor | None = None,
               backend: str = "auto") -> Tensor:  # fmt: skip
    """See the module docstring; ``backend`` as the mixers' (``linrnn.kernels.use_triton``)."""
    (y,) = short_conv_pieces(x, weight, [x.shape[-1]], history, offset, backend)
    return y


def short_conv_pieces(x: Tensor, weight: Tensor, widths: list[int], history: Tensor | None = None,
                      offset: Tensor | None = None, backend: str = "auto") -> tuple[Tensor, ...]:  # fmt: skip
    """``short_conv``'s output split along the channels into ``widths`` (a mixer's streams). On the Triton path
    (up to ``MAX_PIECES`` widths) each piece is its own contiguous tensor, and the backward reads the pieces'
    gradients where they are: a split of one output would have autograd concatenate them, a copy of every row."""
    if sum(widths) != x.shape[-1]:
        raise ValueError(f"short_conv_pieces: argument 'widths' must add up to x's {x.shape[-1]} channels, got "
                         f"{widths}")  # fmt: skip
    if use_triton(x, backend):
        from linrnn.kernels.triton.short_conv import MAX_PIECES

        if history is not None:
            history = history.to(x.dtype)
        if len(widths) <= MAX_PIECES:
            return tuple(short_conv_op(x, weight, history, offset, list(widths)))
        return short_conv_op(x, weight, history, offset, [x.shape[-1]])[0].split(widths, dim=-1)
    return short_conv_torch(x, weight, history, offset).split(widths, dim=-1)


def short_conv_step(x: Tensor, weight: Tensor, history: Tensor, backend: str = "auto",
                    normalize: tuple[int, int, float] | None = None) -> Tensor:  # fmt: skip
    """Decoding, no autograd: ``short_conv(x, weight, history)`` for x ``[B, 1, C]``, and ``history`` (contiguous,
    x's dtype) advanced by one token in place — one Triton launch on CUDA instead of the conv, a concatenation
    and a copy. Needs ``W ≥ 2``. ``normalize`` (channels, group, eps): the first ``channels`` outputs (q and k)
    also L2-normalised in groups of ``group`` (``linrnn.kernels.fused.l2_normalize`` of the output, in the same
    launch)."""
    width = weight.shape[-1]
    if x.shape[1] != 1 or width < 2 or history.dtype != x.dtype or not history.is_contiguous():
        raise ValueError(
            f"short_conv_step: needs x [B, 1, C], W >= 2 and a contiguous history in x's dtype; got x "
            f"{list(x.shape)}, W = {width}, history {history.dtype} contiguous={history.is_contiguous()}"
        )
    if normalize is not None:
        channels, group, _ = normalize
        if not (isinstance(group, int) and group > 0 and isinstance(channels, int)
                and 0 < channels <= x.shape[2] and channels % group == 0):  # fmt: skip
            raise ValueError(f"short_conv_step: argument 'normalize' must be (channels, group, eps) with channels a "
                             f"multiple of group within x's {x.shape[2]} channels, got {normalize!r}")  # fmt: skip
    if use_triton(x, backend):
        from linrnn.kernels.triton.short_conv import short_conv_step as triton_step

        return triton_step(_columns_unit(x), _taps(weight), history, normalize)
    y = short_conv_torch(x, weight, history, None)
    history.copy_(torch.cat([history[..., 1:], x.transpose(1, 2)], dim=-1))
    return y if normalize is None else normalize_leading(y, normalize, backend)


def normalize_leading(y: Tensor, normalize: tuple[int, int, float], backend: str = "auto") -> Tensor:
    """y ``[..., C]`` with its first ``channels`` L2-normalised in groups of ``group`` (``normalize`` = (channels,
    group, eps)), as ``short_conv_step``'s launch does: the paths without that launch."""
    channels, group, eps = normalize
    keys = l2_normalize(y[..., :channels].unflatten(-1, (-1, group)), eps, y.dtype, backend).flatten(-2)
    return torch.cat([keys, y[..., channels:]], dim=-1)


def short_conv_torch(x: Tensor, weight: Tensor, history: Tensor | None, offset: Tensor | None) -> Tensor:
    """``conv1d`` over the channels-first copy; crossing taps removed with one mask per lag."""
    width = weight.shape[-1]
    x = x.transpose(1, 2)  # [B, C, T]
    if history is None:
        history = x.new_zeros(x.shape[0], x.shape[1], width - 1)
    padded = torch.cat([history.to(x.dtype), x], dim=-1)  # [B, C, W − 1 + T]
    y = F.conv1d(padded, weight.to(x.dtype), groups=x.shape[1])
    if offset is not None:  # remove the taps reaching before a document's start (offset < lag)
        steps = x.shape[-1]
        for lag in range(1, width):
            crossing = (offset < lag).to(y.dtype)  # [T]: static shapes, no host work
            reached = padded[..., width - 1 - lag : width - 1 - lag + steps]  # x[t − lag] for every t
            y = y - crossing * (reached * weight[:, :, width - 1 - lag]).to(y.dtype)  # autocast: y is bf16
    return F.silu(y).transpose(1, 2)


@torch.library.custom_op("linrnn::short_conv", mutates_args=())
def short_conv_op(x: Tensor, weight: Tensor, history: Tensor | None, offset: Tensor | None,
                  widths: list[int]) -> list[Tensor]:  # fmt: skip
    from linrnn.kernels.triton.short_conv import short_conv_forward

    return short_conv_forward(_columns_unit(x), _taps(weight), _contiguous(history), _contiguous(offset), widths)


@short_conv_op.register_fake
def _(x, weight, history, offset, widths):
    return [x.new_empty((*x.shape[:-1], width)) for width in widths]


@torch.library.custom_op("linrnn::short_conv_backward", mutates_args=())
def short_conv_backward_op(dys: list[Tensor], x: Tensor, weight: Tensor, history: Tensor | None,
                           offset: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    from linrnn.kernels.triton.short_conv import short_conv_backward

    dx, dw = short_conv_backward([dy.contiguous() for dy in dys], _columns_unit(x), _taps(weight),
                                 _contiguous(history), _contiguous(offset))  # fmt: skip
    d_history = x.new_empty((0,))
    if history is not None:  # only the first W − 1 outputs read the history: differentiate them in torch
        head = weight.shape[-1] - 1

        def first_outputs(h):  # with offset the history is not read: its gradient is 0
            head_offset = None if offset is None else offset[:head]
            return short_conv_torch(x[:, :head].float(), weight.float(), h.float(), head_offset)

        _, vjp = torch.func.vjp(first_outputs, history)
        (d_history,) = vjp(torch.cat([dy[:, :head] for dy in dys], dim=-1).float())
        d_history = d_history.to(history.dtype)
    return dx, dw.to(weight.dtype).view(weight.shape), d_history


@short_conv_backward_op.register_fake
def _(dys, x, weight, history, offset):
    return x.new_empty(x.shape), weight.new_empty(weight.shape), x.new_empty((0,) if history is None else history.shape)


def _setup_context(ctx, inputs, output):
    x, weight, history, offset, widths = inputs
    ctx.save_for_backward(x, weight, history, offset)
    ctx.widths = widths


def _backward(ctx, dys):
    x, weight, history, offset = ctx.saved_tensors
    dys = [x.new_zeros((*x.shape[:-1], width)) if dy is None else dy for dy, width in zip(dys, ctx.widths, strict=True)]
    dx, dw, d_history = short_conv_backward_op(dys, x, weight, history, offset)
    return dx, dw, d_history if history is not None else None, None, None


short_conv_op.register_autograd(_backward, setup_context=_setup_context)


def _taps(weight: Tensor) -> Tensor:
    return weight.reshape(weight.shape[0], weight.shape[-1]).contiguous()


def _columns_unit(x: Tensor) -> Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _contiguous(x: Tensor | None) -> Tensor | None:
    return None if x is None else x.contiguous()
