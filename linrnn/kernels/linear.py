"""``linear(x, weight, bias)``: ``F.linear``, or for a decoding step (a few rows, no autograd, on the Triton path)
one Triton matrix-vector kernel that reads the weight at close to the memory's bandwidth (``triton/gemv.py``).
``Linear`` is ``nn.Linear`` through it: the same parameters, names and hooks.

x may also be the input's last elementwise step left undone — ``RMSNormed`` (a block's residual add + RMSNorm),
``GatedRMSNormed`` (a mixer's per-head output norm) or ``SwiGLUed`` (the MLP's product): the matrix-vector kernel then
does that step as it reads x, one launch for both; on any other path the step runs first as its own kernel
(``linrnn.kernels.fused``) and the product after. Built only without autograd (``fusing_inputs``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.kernels import rows_at_one_stride, use_triton
from linrnn.kernels.fused import MambaGateColumns, gated_rms_norm, rms_norm, swiglu

GEMV_MAX_ROWS = 8  # triton/gemv.py's MAX_ROWS: rows of x (tokens) up to which the matrix-vector kernel runs
GEMV_MAX_GROUP = 2048  # triton/gemv.py's MAX_BLOCK_K: a gated norm's group (head) must fit one K block


def fusing_inputs() -> bool:
    """Whether a model builds fused inputs for ``linear``: no autograd (their backward is not written) and not under
    torch.compile (which fuses on its own)."""
    return not torch.is_grad_enabled() and not torch.compiler.is_compiling()


class FusedInput:
    """The input of ``linear`` as its last elementwise step over some tensor ``source``, the step's output
    ``[..., width]``, not yet computed. ``source`` is ``[..., columns]``: the matrix-vector kernel reads its rows."""

    source: Tensor
    width: int

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.source.shape[:-1], self.width))

    @property
    def device(self) -> torch.device:
        return self.source.device

    @property
    def dtype(self) -> torch.dtype:
        return self.source.dtype

    def compute(self) -> Tensor:
        """The input as a tensor ``[..., width]``, by its own kernel."""
        raise NotImplementedError

    def gemv(self, rows: int, weight: Tensor, bias: Tensor | None, gates: MambaGateColumns | None) -> Tensor | None:
        """The product ``[rows, N]`` by one matrix-vector launch (``gates``: theirs too), or None where the kernel
        cannot do the step."""
        raise NotImplementedError


class RMSNormed(FusedInput):
    """``RMSNorm(x + delta) · weight`` over the last dim (``fused.rms_norm``); ``total`` is ``x + delta`` (x
    without delta), the residual stream, once the norm is computed — by the matrix-vector kernel or on its own."""

    def __init__(self, x: Tensor, weight: Tensor, eps: float, delta: Tensor | None = None, backend: str = "auto"):
        if delta is not None and delta.shape != x.shape:
            raise ValueError(f"RMSNormed: argument 'delta' must have x's shape {list(x.shape)}, got "
                             f"{list(delta.shape)}")  # fmt: skip
        self.source, self.width = x, x.shape[-1]
        self.weight, self.eps, self.delta, self.backend = weight, eps, delta, backend
        self._total = x if delta is None else None

    @property
    def total(self) -> Tensor:
        if self._total is None:
            self.compute()
        return self._total

    def compute(self) -> Tensor:
        if self.delta is None:
            return rms_norm(self.source, self.weight, self.eps, None, self.backend)
        normed, self._total = rms_norm(self.source, self.weight, self.eps, self.delta, self.backend)
        return normed

    def gemv(self, rows: int, weight: Tensor, bias: Tensor | None, gates: MambaGateColumns | None) -> Tensor | None:
        from linrnn.kernels.triton.gemv import gemv_rms_normed

        delta = self.delta
        if delta is not None and (delta.dtype != self.dtype or not rows_at_one_stride(delta)):
            return None
        flat = (t.reshape(rows, self.width) for t in (self.source, delta) if t is not None)
        y, total = gemv_rms_normed(next(flat), next(flat, None), self.weight, self.eps, weight, bias, gates)
        if total is not None:
            self._total = total.view(self.source.shape)
        return y


class GatedRMSNormed(FusedInput):
    """Per head, ``RMSNorm(x) · weight · act(z)`` (``fused.gated_rms_norm``) for x, z ``[B, T, H, D]``, as the
    ``[B, T, H · D]`` input of the output projection."""

    def __init__(self, x: Tensor, z: Tensor, weight: Tensor, eps: float, gate: str = "silu", backend: str = "auto"):
        self.x, self.z, self.weight, self.eps, self.gate, self.backend = x, z, weight, eps, gate, backend
        self.width = x.shape[-2] * x.shape[-1]
        # the heads side by side, [..., H · D]: a view where x's heads are dense (else a [0]-row stand-in, which
        # no kernel reads: the norm then runs on its own)
        dense = x.stride(-1) == 1 and x.stride(-2) == x.shape[-1]
        self.source = x.flatten(-2) if dense else x.new_empty(0, self.width)

    @property
    def shape(self) -> torch.Size:
        return torch.Size((*self.x.shape[:-2], self.width))

    def compute(self) -> Tensor:
        return gated_rms_norm(self.x, self.z, self.weight, self.eps, self.backend, self.gate).flatten(-2)

    def gemv(self, rows: int, weight: Tensor, bias: Tensor | None, gates: MambaGateColumns | None) -> Tensor | None:
        from linrnn.kernels.triton.gemv import gemv_gated_rms_normed

        group = self.x.shape[-1]
        z = self.z.flatten(-2) if self.z.stride(-2) == group else None
        if group & (group - 1) or group > GEMV_MAX_GROUP or z is None or z.dtype != self.dtype:
            return None  # the kernel's groups are powers of two inside one K block
        if not rows_at_one_stride(self.source) or not rows_at_one_stride(z) or not self.weight.is_contiguous():
            return None
        return gemv_gated_rms_normed(self.source.reshape(rows, self.width), z.reshape(rows, self.width), self.weight,
                                     self.eps, self.gate == "sigmoid", weight, bias, gates)  # fmt: skip


class SwiGLUed(FusedInput):
    """``SiLU(a) · b`` (``fused.swiglu``) for ``both`` ``[..., 2F]`` = ``[a | b]`` (the MLP's one gate + up product)."""

    def __init__(self, both: Tensor, backend: str = "auto"):
        if both.shape[-1] % 2:
            raise ValueError(f"SwiGLUed: argument 'both' must have an even last dim, got {list(both.shape)}")
        self.source, self.width, self.backend = both, both.shape[-1] // 2, backend

    def compute(self) -> Tensor:
        return swiglu(self.source, self.backend)

    def gemv(self, rows: int, weight: Tensor, bias: Tensor | None, gates: MambaGateColumns | None) -> Tensor | None:
        from linrnn.kernels.triton.gemv import gemv_swiglu

        return gemv_swiglu(self.source.reshape(rows, 2 * self.width), weight, bias, gates)


def linear(x: Tensor | FusedInput, weight: Tensor, bias: Tensor | None = None, backend: str = "auto",
           gates: MambaGateColumns | None = None) -> Tensor:  # fmt: skip
    """``F.linear(x, weight, bias)``; ``backend`` as the mixers' (``linrnn.kernels.use_triton``). ``gates``: where the
    matrix-vector kernel runs, it also computes the gates of those output columns (``gates.g`` and ``gates.beta``
    ``[..., columns]`` fp32, left None otherwise: the caller computes them from the product)."""
    if isinstance(x, FusedInput):
        if _takes_gemv(x.source, weight, bias, backend):
            rows = x.source.numel() // x.source.shape[-1]
            y = x.gemv(rows, weight, bias, gates)
            if y is not None:
                return _shaped(y, x.shape, gates)
        x = x.compute()  # the step on its own, then the product
    if _takes_gemv(x, weight, bias, backend):
        from linrnn.kernels.triton.gemv import gemv

        rows = x.reshape(-1, x.shape[-1])  # a view: x's rows are at one stride (checked)
        return _shaped(gemv(rows, weight, bias, gates=gates), x.shape, gates)
    return F.linear(x, weight, bias)


def _shaped(y: Tensor, shape: torch.Size, gates: MambaGateColumns | None) -> Tensor:
    """The kernel's ``[rows, N]`` outputs (and the gates') with x's leading dims."""
    if gates is not None:
        gates.g, gates.beta = (t.view(*shape[:-1], t.shape[-1]) for t in (gates.g, gates.beta))
    return y.view(*shape[:-1], y.shape[-1])


def _takes_gemv(x: Tensor, weight: Tensor, bias: Tensor | None, backend: str) -> bool:
    """A decoding step: at most ``GEMV_MAX_ROWS`` rows, no autograd, not under torch.compile or autocast, x and
    the weight of one 16-bit dtype, the weight contiguous and x's rows at one stride."""
    if not use_triton(x, backend) or not fusing_inputs():  # autograd or torch.compile: F.linear
        return False
    if x.dtype not in (torch.bfloat16, torch.float16) or weight.dtype != x.dtype or weight.device != x.device:
        return False
    if torch.is_autocast_enabled(x.device.type) or x.numel() // max(x.shape[-1], 1) > GEMV_MAX_ROWS:
        return False
    if not weight.is_contiguous() or (bias is not None and not bias.is_contiguous()):
        return False
    return rows_at_one_stride(x) and x.numel() > 0


class Linear(nn.Linear):
    """``nn.Linear`` whose forward is ``linear`` (a decoding step's matrix-vector kernel, fused inputs included);
    ``backend`` as the mixers'."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, backend: str = "auto"):
        super().__init__(in_features, out_features, bias=bias)
        self.backend = backend

    def forward(self, x: Tensor | FusedInput) -> Tensor:
        return linear(x, self.weight, self.bias, self.backend)
