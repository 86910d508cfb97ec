"""``linear(x, weight, bias)``: ``F.linear``, or for a decoding step (a few rows, no autograd, on the Triton path)
one Triton matrix-vector kernel that reads the weight at close to the memory's bandwidth (``triton/gemv.py``).
``Linear`` is ``nn.Linear`` through it: the same parameters, names and hooks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.kernels import rows_at_one_stride, use_triton

GEMV_MAX_ROWS = 8  # triton/gemv.py's MAX_ROWS: rows of x (tokens) up to which the matrix-vector kernel runs


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, backend: str = "auto") -> Tensor:
    """``F.linear(x, weight, bias)``; ``backend`` as the mixers' (``linrnn.kernels.use_triton``)."""
    if _takes_gemv(x, weight, bias, backend):
        from linrnn.kernels.triton.gemv import gemv

        rows = x.reshape(-1, x.shape[-1])  # a view: x's rows are at one stride (checked)
        return gemv(rows, weight, bias).view(*x.shape[:-1], weight.shape[0])
    return F.linear(x, weight, bias)


def _takes_gemv(x: Tensor, weight: Tensor, bias: Tensor | None, backend: str) -> bool:
    """A decoding step: at most ``GEMV_MAX_ROWS`` rows, no autograd, not under torch.compile or autocast, x and
    the weight of one 16-bit dtype, the weight contiguous and x's rows at one stride."""
    if not use_triton(x, backend) or torch.is_grad_enabled() or torch.compiler.is_compiling():
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype or weight.device != x.device:
        return False
    if torch.is_autocast_enabled(x.device.type) or x.numel() // max(x.shape[-1], 1) > GEMV_MAX_ROWS:
        return False
    if not weight.is_contiguous() or (bias is not None and not bias.is_contiguous()):
        return False
    return rows_at_one_stride(x) and x.numel() > 0


class Linear(nn.Linear):
    """``nn.Linear`` whose forward is ``linear`` (a decoding step's matrix-vector kernel); ``backend`` as the
    mixers'."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, backend: str = "auto"):
        super().__init__(in_features, out_features, bias=bias)
        self.backend = backend

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias, self.backend)
