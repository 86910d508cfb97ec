"""What every cell's mixer layer shares.

x → projections → causal depthwise short conv + SiLU (q, k, v and any extra key
streams) → heads → optional RoPE (q, k) → L2 norm (q, k, extras) → the cell's gates
and recurrence op → per-head gated RMSNorm → o_proj.

A cell subclasses ``LinearRNNMixer``, adds its gate parameters in ``__init__``,
names its op (``op``) and the gate projections that read x (``gate_inputs``), and
implements ``gates``. All projections of x run as one GEMM (``project``), and the
short convs of all streams as one (``short_convs``). Decoding carries a
``MixerState``: the short-conv history and the recurrent state, so step-by-step
decoding equals the full forward.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from einops import rearrange
from pydantic import BaseModel, ConfigDict, Field, model_validator
from torch import Tensor, nn

from linrnn.kernels import eager
from linrnn.kernels.context_parallel import Shard, chained_recurrence, convolve_with_halo
from linrnn.kernels.fused import MambaGateColumns, gated_rms_norm, l2_normalize
from linrnn.kernels.linear import FusedInput, GatedRMSNormed, Linear, fusing_inputs, linear
from linrnn.kernels.short_conv import normalize_leading, short_conv, short_conv_pieces, short_conv_step


class MixerOptions(BaseModel):
    """Options of a mixer layer that do not depend on the model's width."""

    model_config = ConfigDict(extra="forbid")

    expand_k: float = Field(
        0.75, gt=0, description="key width = expand_k * hidden_size (Gated DeltaNet's default, as in the GDN-muP paper)"
    )
    expand_v: float = Field(1.5, gt=0, description="value width = expand_v * hidden_size")
    head_k_dim: int | None = Field(None, gt=0, description="per-head key dim; overrides expand_k")
    head_v_dim: int | None = Field(None, gt=0, description="per-head value dim; overrides expand_v")
    use_short_conv: bool = True
    conv_size: int = Field(4, ge=1)
    allow_neg_eigval: bool = Field(False, description="beta in [0, 2] instead of [0, 1]")
    gate_low_rank: int | None = Field(
        None, gt=0, description="rank of low-rank gate projections (cell default if None)"
    )
    use_rope: bool = False
    rope_theta: float = Field(10000.0, gt=0)
    norm_eps: float = Field(1e-6, gt=0)
    output_gate: Literal["silu", "sigmoid"] = Field(
        "silu", description="the output gate's activation in the gated RMSNorm (FLA's KDA: sigmoid)"
    )
    output_gate_low_rank: int | None = Field(
        None, gt=0, description="rank of a low-rank output gate projection, with a bias (FLA's KDA: head_v_dim)"
    )
    output_multiplier: float = Field(
        1.0, gt=0, description="multiplies the recurrence output before the gated RMSNorm (GDN-muP §4.3: d_k / d_k0)"
    )
    backend: str = "auto"
    chunk_size: int | None = Field(None, gt=0)


class MixerConfig(MixerOptions):
    hidden_size: int = Field(gt=0)
    num_heads: int = Field(gt=0)

    @model_validator(mode="after")
    def _head_dims(self) -> MixerConfig:
        for dim, expand in (("head_k_dim", "expand_k"), ("head_v_dim", "expand_v")):
            if getattr(self, dim) is not None:
                continue
            width = self.hidden_size * getattr(self, expand)
            if width != int(width) or int(width) % self.num_heads:
                raise ValueError(
                    f"{expand} * hidden_size = {width:g} must be an integer divisible by num_heads = "
                    f"{self.num_heads}; set {dim} explicitly or change {expand}"
                )
            setattr(self, dim, int(width) // self.num_heads)
        if self.use_rope and self.head_k_dim % 2:
            raise ValueError(f"use_rope needs an even head_k_dim, got {self.head_k_dim}")
        return self


@dataclass
class MixerState:
    """Carried between calls: the short-conv history ``[B, C, W−1]`` (the last inputs of the streams' one conv, key
    ``"streams"``: q, k, v and any extra key streams side by side), recurrent state ``[B, H, K, V]``, and the number
    of tokens seen (RoPE's position): an int, or a ``[B]`` tensor when rows are at different positions.

    ``in_place``: the state is a set of buffers (a decoding engine's slots) that the layer updates in place and
    returns; its ``position`` is left to the caller to advance. Inference only (no autograd).

    ``kv``: the attention mixer's cache instead (``linrnn.recurrences.attention``): keys (after RoPE) and values
    ``[B, H, T_seen, K]``, one entry per token seen, so it grows as decoding goes on; ``in_place``, buffers
    ``[B, H, capacity, K]`` of which each row's first ``position`` entries are valid."""

    conv: dict[str, Tensor] = field(default_factory=dict)
    recurrent: Tensor | None = None
    position: int | Tensor = 0
    in_place: bool = False
    kv: tuple[Tensor, Tensor] | None = None


@dataclass
class Documents:
    """Packed documents on one folded sequence ``[1, N]`` (N = B · T): recurrent state and short-conv history
    start from zero at each document start. Built by ``from_positions``. Under context parallelism (``shard``) the
    rows are this rank's slices of longer rows: a row's first document may have begun on an earlier rank
    (``linrnn.kernels.context_parallel``)."""

    cu_seqlens: Tensor  # [D + 1] int64 document boundaries on the CPU: read once here, no device sync per layer
    offset: Tensor  # [N] index of each token within its document, on the tokens' device
    positions: Tensor  # [N] the caller's positions (RoPE)
    shard: Shard | None = None

    @classmethod
    def from_positions(cls, positions: Tensor, context_group: dist.ProcessGroup | None = None) -> Documents:
        """``positions`` ``[B, T]``: a document starts wherever the position is 0, and at every row start. Costs one
        device sync (the boundaries come to the host). Under torch.compile it runs eagerly, outside the graph: the
        number of documents depends on the data. ``context_group``: the rows are this rank's slices of rows split
        along time over that group's ranks, in rank order (a row start with a position above 0 continues a
        document from the previous rank)."""
        return _documents(positions, context_group)


@eager
def _documents(positions: Tensor, context_group: dist.ProcessGroup | None) -> Documents:
    """``Documents.from_positions``."""
    rows, length = positions.shape
    starts = positions == 0
    starts[:, 0] = True
    starts = starts.flatten()
    index = torch.arange(starts.numel(), device=positions.device)
    offset = index - torch.where(starts, index, 0).cummax(0).values  # distance to the last start at or before
    start_index = starts.cpu().nonzero().squeeze(1)  # [D] on the host
    cu_seqlens = torch.cat([start_index, torch.tensor([starts.numel()])])
    documents = Documents(cu_seqlens=cu_seqlens, offset=offset, positions=positions.flatten())
    if context_group is None:
        return documents
    rank, size = dist.get_rank(context_group), dist.get_world_size(context_group)
    continued = positions[:, 0].cpu() != 0  # one more small copy to the host, under context parallelism only
    if rank == 0 and continued.any():
        raise ValueError(
            f"context parallelism: rank 0 holds the start of every row, so its positions must be 0 at each row "
            f"start; got {positions[:, 0].tolist()}"
        )
    row_starts = torch.arange(rows + 1) * length
    documents.shard = Shard(
        group=context_group,
        rank=rank,
        size=size,
        rows=rows,
        continued=continued,
        first_document=torch.searchsorted(start_index, row_starts[:-1]),
        last_document=torch.searchsorted(start_index, row_starts[1:]) - 1,
    )
    return documents


class ShortConv(nn.Module):
    """One stream's causal depthwise conv weight ``[C, 1, W]``. The mixer convolves all its streams at once
    (``causal_conv`` over the concatenated channels and weights); run alone (coordinate checks hook each module),
    ``forward`` is ``causal_conv`` with this weight."""

    def __init__(self, channels: int, kernel_size: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x: Tensor, history: Tensor | None = None, documents: Documents | None = None,
                backend: str = "auto", in_place: bool = False):  # fmt: skip
        return causal_conv(x, self.weight, history, documents, backend, in_place)


def causal_conv(x: Tensor, weight: Tensor, history: Tensor | None = None, documents: Documents | None = None,
                backend: str = "auto", in_place: bool = False, normalize: tuple[int, int, float] | None = None,
                widths: list[int] | None = None) -> tuple[Tensor | tuple[Tensor, ...], Tensor | None]:  # fmt: skip
    """Causal depthwise conv over time followed by SiLU (``linrnn.kernels.short_conv``): x ``[B, T, C]`` (any row
    stride), weight ``[C, 1, W]`` → (SiLU(conv) ``[B, T, C]``, last ``W − 1`` inputs ``[B, C, W − 1]``). With packed
    ``documents`` (B = 1), taps reaching before a document's start contribute nothing, and the second result is None
    (``last_inputs_per_document`` gives each document's). ``backend`` is the mixer's (``linrnn.kernels.use_triton``).
    ``in_place`` (decoding): the new last inputs are written into ``history``, which is returned; one token takes
    ``short_conv_step``. ``normalize`` (channels, group, eps): the first ``channels`` outputs L2-normalised in
    groups of ``group`` (decoding's q and k: in the step's launch). ``widths``: the first result split along the
    channels into a tuple of these widths, as separate tensors where the conv runs whole (``short_conv_pieces``)."""
    if normalize is not None and not (in_place and x.shape[1] == 1 and documents is None):
        raise ValueError("causal_conv: argument 'normalize' is for one decoding token (in_place, T = 1, no documents)")
    keep = weight.shape[-1] - 1

    def split(y: Tensor) -> Tensor | tuple[Tensor, ...]:
        return y if widths is None else y.split(widths, dim=-1)

    def whole(offset: Tensor | None) -> Tensor | tuple[Tensor, ...]:
        if widths is None:
            return short_conv(x, weight, history if offset is None else None, offset, backend)
        return short_conv_pieces(x, weight, widths, history if offset is None else None, offset, backend)

    if documents is not None and documents.shard is not None:  # context parallelism: the previous rank's inputs first
        conv = lambda inputs, offset: short_conv(inputs, weight, None, offset, backend)  # noqa: E731
        return split(convolve_with_halo(conv, x, documents.shard, documents.positions, keep)), None
    if documents is not None:
        return whole(documents.offset), None
    if in_place and x.shape[1] == 1 and keep > 0 and history.dtype == x.dtype and history.is_contiguous():
        return split(short_conv_step(x, weight, history, backend, normalize)), history
    if normalize is not None:
        y = split(normalize_leading(short_conv(x, weight, history, None, backend), normalize, backend))
    else:
        y = whole(None)
    if in_place:
        return y, history.copy_(last_inputs(x, history, keep))
    return y, last_inputs(x, history, keep)


def last_inputs(x: Tensor, history: Tensor | None, keep: int) -> Tensor:
    """The last ``keep`` inputs ``[B, C, keep]`` of history followed by x ``[B, T, C]``."""
    if x.shape[1] < keep:
        if history is None:
            history = x.new_zeros(x.shape[0], x.shape[2], keep)
        return torch.cat([history.to(x.dtype), x.transpose(1, 2)], dim=-1)[..., x.shape[1] :]
    return x[:, x.shape[1] - keep :].transpose(1, 2).contiguous()  # a copy: decode state must not pin x


def last_inputs_per_document(x: Tensor, documents: Documents, keep: int) -> Tensor:
    """Each packed document's last ``keep`` inputs ``[D, C, keep]`` (oldest first; zeros before its start) from x
    ``[1, N, C]``."""
    starts, ends = documents.cu_seqlens[:-1], documents.cu_seqlens[1:]  # on the host
    index = ends[:, None] - keep + torch.arange(keep)  # [D, keep]
    inside = (index >= starts[:, None]).to(x.device)
    rows = x[0, index.clamp_min(0).to(x.device)] * inside[..., None].to(x.dtype)  # [D, keep, C]
    return rows.transpose(1, 2).contiguous()


class GatedRMSNorm(nn.Module):
    """Per-head RMSNorm of the recurrence output, times SiLU (``gate`` "silu") or sigmoid ("sigmoid") of the output
    gate (fp32 arithmetic; ``linrnn.kernels.fused``)."""

    def __init__(self, dim: int, eps: float, gate: str = "silu"):
        super().__init__()
        self.eps, self.gate = eps, gate
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor, gate: Tensor, backend: str = "auto") -> Tensor:
        """x, gate ``[B, T, H, D]`` → ``[B, T, H, D]`` in x's dtype; ``backend`` is the mixer's."""
        return gated_rms_norm(x, gate, self.weight, self.eps, backend, self.gate)

    def fused_input(self, x: Tensor, gate: Tensor, backend: str = "auto") -> GatedRMSNormed:
        """``forward`` as the ``[B, T, H · D]`` input of the next product, left to its kernel
        (``linrnn.kernels.linear.GatedRMSNormed``)."""
        return GatedRMSNormed(x, gate, self.weight, self.eps, self.gate, backend)


def _concatenated(linears: list[nn.Linear], padding: int) -> tuple[Tensor, Tensor | None]:
    """The weights (and biases, zero where absent) of ``linears`` stacked, then ``padding`` zero rows."""
    weights = [linear.weight for linear in linears]
    weight = torch.cat([*weights, weights[0].new_zeros(padding, weights[0].shape[1])])
    if all(linear.bias is None for linear in linears):
        return weight, None
    biases = [linear.weight.new_zeros(linear.out_features) if linear.bias is None else linear.bias
              for linear in linears]  # fmt: skip
    return weight, torch.cat([*biases, biases[0].new_zeros(padding)])


def at_least_fp32(x: Tensor) -> Tensor:
    """Gates and norms compute in fp32 for bf16/fp16 inputs and keep fp64 for fp64 models."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def apply_rope(x: Tensor, start: int | Tensor, theta: float, positions: Tensor | None = None) -> Tensor:
    """Rotary embedding on ``[B, T, H, K]`` (half-split pairs) at positions ``start .. start + T − 1``, where
    ``start`` is an int or a ``[B]`` tensor (one start per row: decoding slots); or at ``positions`` ``[T]``, the
    tokens' own positions (packed documents, B = 1)."""
    half = x.shape[-1] // 2
    wide = at_least_fp32(x)
    inv_freq = theta ** (-torch.arange(half, device=x.device, dtype=wide.dtype) / half)
    if positions is not None:
        at = positions.to(wide.dtype)[None]  # [1, T]
    else:
        steps = torch.arange(x.shape[1], device=x.device, dtype=wide.dtype)
        at = start.to(wide.dtype)[:, None] + steps if isinstance(start, Tensor) else (start + steps)[None]
    angles = at[..., None] * inv_freq  # [1 or B, T, K/2]
    cos, sin = angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]
    first, second = wide[..., :half], wide[..., half:]
    rotated = torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)
    return rotated.to(x.dtype)


def mamba_decay_params(num_heads: int, dt_size: int) -> tuple[nn.Parameter, nn.Parameter]:
    """``A_log = log U(0, 16)`` per head; ``dt`` log-uniform in [1e-3, 1e-1], ``dt_bias = dt + log(−expm1(−dt))``."""
    a = torch.empty(num_heads).uniform_(0, 16).clamp_min(1e-4)  # clamp: log(0) on the measure-zero draw
    dt = torch.exp(torch.empty(dt_size).uniform_(math.log(1e-3), math.log(1e-1)))
    return nn.Parameter(a.log()), nn.Parameter(dt + torch.log(-torch.expm1(-dt)))


PROJECTION_ALIGNMENT = 64  # columns: the fused projection's rows stay 128-byte aligned in bf16
Q_K_NORM_EPS = 1e-6  # q and k: x / sqrt(‖x‖² + eps), FLA's in-kernel norm


class InferenceCache:
    """``_inference_cached``: weights concatenated for one GEMM, kept between decoding steps. A module using it sets
    ``self._inference_cache = {}`` in its ``__init__``."""

    _inference_cache: dict[str, tuple]

    def _inference_cached(self, slot: str, parameters: list[Tensor], build: Callable[[], Any]) -> Any:
        """``build()`` (weights concatenated from ``parameters``). Without autograd (inference) the result is kept
        until a parameter changes (its storage, version counter or dtype) or autograd is on again, so a decode step
        does not copy weights."""
        if torch.compiler.is_compiling():
            return build()
        if torch.is_grad_enabled():
            self._inference_cache.pop(slot, None)  # training again: free the inference copy
            return build()
        key = tuple((p.data_ptr(), p._version, p.dtype) for p in parameters)
        cached = self._inference_cache.get(slot)
        if cached is not None and cached[0] == key:
            return cached[1]
        value = build()
        self._inference_cache[slot] = (key, value)
        return value


class LinearRNNMixer(InferenceCache, nn.Module):
    """Token mixer shared by all cells; subclasses add their gate parameters and implement ``gates``."""

    spec: Any  # the cell's CellSpec (its op is spec.op), and its registry name: both set by register_cell
    cell: str
    extra_key_streams: tuple[str, ...] = ()  # e.g. ("a",): projected, convolved and L2-normed like k
    gate_inputs: tuple[str, ...] = ()  # the cell's projections of x (``<name>_proj``), in the layer's one GEMM
    normalize_keys: bool = True  # L2-normalise q and k (Mamba-2's C and B are not)
    takes_fused_input = True  # x may be a linrnn.kernels.linear.FusedInput (the block's add + norm, decoding)
    scale: float | None = None  # the op's query scale (None: K ** -0.5)

    def __init__(self, config: MixerConfig):
        super().__init__()
        self.config = config
        self.probes: dict[str, Tensor] | None = None  # a dict to fill on each forward (linrnn.parametrizations)
        self.gate_stats: dict[str, Tensor] | None = None  # a dict: each forward leaves mean β and mean decay there
        self._inference_cache: dict[str, tuple] = {}  # concatenated weights without autograd (_inference_cached)
        hidden, heads = config.hidden_size, config.num_heads
        self.num_heads, self.head_k_dim, self.head_v_dim = heads, config.head_k_dim, config.head_v_dim
        key_width, value_width = heads * self.head_k_dim, heads * self.head_v_dim
        for name in ("q", "k", *self.extra_key_streams):
            setattr(self, f"{name}_proj", nn.Linear(hidden, key_width, bias=False))
        self.v_proj = nn.Linear(hidden, value_width, bias=False)
        if config.use_short_conv:
            for name in self.stream_names:
                width = value_width if name == "v" else key_width
                setattr(self, f"{name}_conv", ShortConv(width, config.conv_size))
        rank = config.output_gate_low_rank
        self.g_proj = (
            nn.Linear(hidden, value_width, bias=False)
            if rank is None
            else nn.Sequential(nn.Linear(hidden, rank, bias=False), nn.Linear(rank, value_width, bias=True))
        )
        self.o_norm = GatedRMSNorm(self.head_v_dim, config.norm_eps, config.output_gate)
        self.o_proj = Linear(value_width, hidden, bias=False, backend=config.backend)

    @property
    def stream_names(self) -> tuple[str, ...]:
        return ("q", "k", "v", *self.extra_key_streams)

    def local_param_roles(self) -> dict[str, str]:
        """{parameter name: role}, from this cell's registry entry."""
        roles = self.spec.roles
        missing = [name for name, _ in self.named_parameters() if name not in roles]
        if missing:
            raise ValueError(f"cell {self.cell!r}: parameters without a role: {missing}")
        return {name: roles[name] for name, _ in self.named_parameters()}

    @property
    def beta_scale(self) -> float:
        """β's range is (0, beta_scale): 2 when negative eigenvalues are allowed, else 1."""
        return 2.0 if self.config.allow_neg_eigval else 1.0

    def write_strength(self, pre: Tensor) -> Tensor:
        """``beta = sigmoid(W_β x)`` ``[B, T, H]`` (at least fp32) from ``pre = W_β x``, times ``beta_scale``."""
        beta = at_least_fp32(pre).sigmoid()
        return beta if self.beta_scale == 1 else self.beta_scale * beta

    def gates(self, projected: dict[str, Tensor], k: Tensor, extra: dict[str, Tensor]) -> dict[str, Tensor]:
        """The cell's recurrence inputs besides q, k, v, as its op names them: any of ``g`` (log-decay
        ``[B, T, H]`` or ``[B, T, H, K]``), ``beta`` ``[B, T, H]``, ``a`` (erase direction) and ``log_gamma``.
        ``projected`` holds the layer input's projections (``project``), e.g. ``projected["b"]`` = ``b_proj(x)``."""
        raise NotImplementedError

    def gate_columns(self, columns: dict[str, tuple[int, int]]) -> MambaGateColumns | None:
        """Gates the projection's kernel may compute beside it when decoding (``linear``'s ``gates``), given each
        projection's (first column, width) in the one product: None (default), or the cell's Mamba-style decay and
        β; ``gates`` then finds them as ``projected["mamba_gates"]`` where the kernel did."""
        return None

    def erase_direction(self, k: Tensor, extra: dict[str, Tensor]) -> Tensor | None:
        """The unit erase direction ``[B, T, H, K]`` of the recurrence (from the cell's structure): k for a tied
        erase, the first extra key stream for a decoupled one, None without erase."""
        erase = self.spec.structure.erase
        return None if erase == "off" else k if erase == "tied" else extra[self.extra_key_streams[0]]

    def combine(self, o: Tensor, v: Tensor) -> Tensor:
        """The recurrence output ``[B, T, H, V]`` as the output norm reads it, given the values ``v`` (Mamba-2 adds
        its skip ``D v`` here)."""
        return o

    def recurrence_inputs(self, x: Tensor, state: MixerState | None = None) -> dict[str, Tensor]:
        """What the recurrence sees for input ``x`` ``[B, T, hidden]``: the gates (``gates``) and ``erase``
        (the unit erase direction, or absent without erase). Used by ``linrnn.stability`` on real inputs."""
        projected = self.project(x)
        _, k, _, extra, _ = self.streams(projected, state)
        inputs = self.gates(projected, k, extra)
        erase = self.erase_direction(k, extra)
        return inputs if erase is None else {**inputs, "erase": erase}

    def input_projections(self) -> dict[str, nn.Module]:
        """Every projection of the layer input x by name: the streams, the output gate ``g`` and the cell's
        ``gate_inputs`` (``<name>_proj``; a low-rank ``nn.Sequential`` reads x with its first layer)."""
        names = (*self.stream_names, "g", *self.gate_inputs)
        return {name: getattr(self, f"{name}_proj") for name in names}

    def project(self, x: Tensor | FusedInput) -> dict[str, Tensor]:
        """{name: projection of x ``[B, T, width]``} for ``input_projections``, plus ``"streams"``: the columns of all
        the streams (q, k, v, extra keys; they come first), which the short conv reads as one block. Without
        autograd (decoding, evaluation) all run as one GEMM over the concatenated weights, kept between calls. With
        autograd, two: the streams', whose output is the block itself, so the short conv's input gradient is that
        GEMM's output gradient as it is, and the rest's (one GEMM over all would concatenate the two gradients: a copy
        of every row). Each GEMM's width is padded with zero rows to a multiple of ``PROJECTION_ALIGNMENT``: with an
        unaligned row (GDN's q, k, v, g and two gates: 4620 columns at 340M) cuBLAS ran an sm80 CUTLASS kernel at
        ~260 TFLOP/s on an H100 instead of its Hopper kernels. While probed (coordinate checks, which hook each
        module) every module runs on its own and there is no ``"streams"`` block."""
        projections = self.input_projections()
        if self.probes is not None:
            x = x.compute() if isinstance(x, FusedInput) else x
            return {name: module(x) for name, module in projections.items()}
        first = {name: module[0] if isinstance(module, nn.Sequential) else module
                 for name, module in projections.items()}  # fmt: skip
        names = list(first)
        streams = len(self.stream_names)
        groups = [names[:streams], names[streams:]] if torch.is_grad_enabled() else [names]
        projected: dict[str, Tensor] = {}
        for index, group in enumerate(groups):
            linears = [first[name] for name in group]
            widths = [linear.out_features for linear in linears]
            padding = -sum(widths) % PROJECTION_ALIGNMENT
            parameters = [p for linear in linears for p in (linear.weight, linear.bias) if p is not None]
            slot = "projection" if index == 0 else f"projection{index}"  # training pops the inference copy's slot
            weight, bias = self._inference_cached(slot, parameters,
                                                  partial(_concatenated, linears, padding))  # fmt: skip
            starts = [sum(widths[:i]) for i in range(len(widths))]
            columns = {name: (start, width) for name, start, width in zip(group, starts, widths, strict=True)}
            gates = self.gate_columns(columns) if fusing_inputs() else None
            product = linear(x, weight, bias, self.config.backend, gates)
            if index == 0:  # the streams come first: their block as one tensor, the streams as its views
                width = sum(widths[:streams])
                block = product if width == product.shape[-1] else product[..., :width]
                projected["streams"] = block
                projected.update(zip(names[:streams], block.split(widths[:streams], dim=-1), strict=True))
            *pieces, _ = product.split([*widths, padding], dim=-1)  # the last: the padding
            projected.update((name, piece) for name, piece in zip(group, pieces, strict=True) if name not in projected)
            if gates is not None and gates.g is not None:
                projected["mamba_gates"] = {"g": gates.g, "beta": gates.beta}
        for name, module in projections.items():
            if isinstance(module, nn.Sequential):
                projected[name] = module[1:](projected[name])
        return projected

    def short_convs(self, projected: dict[str, Tensor], history: Tensor | None, documents: Documents | None,
                    in_place: bool, normalize: tuple[int, int, float] | None = None
                    ) -> tuple[dict[str, Tensor], Tensor | None]:  # fmt: skip
        """Every stream's causal conv + SiLU as one (``causal_conv`` over ``projected["streams"]`` with the streams'
        weights side by side; one launch each way on CUDA): ({name: ``[B, T, width]``}, the new history
        ``[B, C, W − 1]`` of all streams). Probed, each stream's ``ShortConv`` runs on its own (its hooks fire)."""
        names = self.stream_names
        convs = [getattr(self, f"{name}_conv") for name in names]
        widths = [conv.weight.shape[0] for conv in convs]
        backend = self.config.backend
        if "streams" not in projected:  # probed: module by module, histories split and joined
            previous = [None] * len(names) if history is None else history.split(widths, dim=1)
            outputs = [conv(projected[name], h, documents, backend)
                       for name, conv, h in zip(names, convs, previous, strict=True)]  # fmt: skip
            new = None if documents is not None else torch.cat([h for _, h in outputs], dim=1)
            if in_place:
                new = history.copy_(new)
            return {name: y for name, (y, _) in zip(names, outputs, strict=True)}, new
        weights = [conv.weight for conv in convs]
        weight = self._inference_cached("conv", weights, lambda: torch.cat(weights))
        pieces, new = causal_conv(projected["streams"], weight, history, documents, backend, in_place, normalize,
                                  widths)  # fmt: skip
        return dict(zip(names, pieces, strict=True)), new

    def _keys_normalized_in_conv(self, projected: dict[str, Tensor], in_place: bool) -> tuple[int, int, float] | None:
        """Decoding one token through the streams' one conv: q and k's L2 norm in the short conv's launch, as
        ``causal_conv``'s ``normalize`` (not with RoPE, which comes between the two)."""
        config = self.config
        streams = projected.get("streams")  # absent when probed (each stream's conv on its own)
        if not (config.use_short_conv and in_place and streams is not None and streams.shape[1] == 1
                and self.normalize_keys and not config.use_rope):  # fmt: skip
            return None
        return 2 * self.num_heads * self.head_k_dim, self.head_k_dim, Q_K_NORM_EPS

    def streams(self, projected: dict[str, Tensor], state: MixerState | None = None,
                documents: Documents | None = None):  # fmt: skip
        """Short conv, heads, RoPE and L2 norm of the projected streams (``project``): (q, k, v, extra, new conv
        history)."""
        config = self.config
        history = state.conv if state is not None else {}
        position = state.position if state is not None else 0
        in_place = state is not None and state.in_place
        new_history, streams = {}, {}
        normalize = self._keys_normalized_in_conv(projected, in_place)
        if config.use_short_conv:
            convolved, new_history["streams"] = self.short_convs(projected, history.get("streams"), documents,
                                                                 in_place, normalize)  # fmt: skip
        else:
            convolved = {name: F.silu(projected[name]) for name in self.stream_names}
        for name, h in convolved.items():
            streams[name] = rearrange(h, "b t (h d) -> b t h d", h=self.num_heads)
        if config.use_rope:
            for name in ("q", "k"):
                positions = None if documents is None else documents.positions
                streams[name] = apply_rope(streams[name], position, config.rope_theta, positions)
        q, k, v = streams.pop("q"), streams.pop("k"), streams.pop("v")
        # the recurrence runs in v's dtype (bf16 under autocast): the L2 norms compute in fp32 and return that
        if self.normalize_keys and normalize is None:
            q, k = (l2_normalize(h, Q_K_NORM_EPS, v.dtype, config.backend) for h in (q, k))
        else:
            q, k = q.to(v.dtype), k.to(v.dtype)
        # extra key streams are erase directions, which the ops take as unit rows: an eps far below ‖x‖² (FLA's 1e-6
        # on q and k left rows of N(0, init_std²)-initialised convs 1.5% short of unit norm in bf16)
        extra = {name: l2_normalize(h, 1e-12, v.dtype, config.backend) for name, h in streams.items()}
        return q, k, v, extra, new_history

    def forward(self, x: Tensor | FusedInput, state: MixerState | None = None, output_state: bool = False,
                documents: Documents | None = None):  # fmt: skip
        """x ``[B, T, hidden]`` (or the block's norm left to the projection's kernel: ``takes_fused_input``) →
        (y ``[B, T, hidden]``, new MixerState or None). With ``documents`` (B = 1), the recurrence and the short
        convs restart at each document start, and the new state has a row per document."""
        projected = self.project(x)
        q, k, v, extra, new_history = self.streams(projected, state, documents)
        position = state.position if state is not None else 0
        in_place = state is not None and state.in_place
        gates = self.gates(projected, k, extra)
        if self.gate_stats is not None:  # training metrics; tensors, so reading them is the only sync
            self.gate_stats.update({"beta": gates["beta"].detach().mean()} if "beta" in gates else {})
            self.gate_stats.update({"decay": gates["g"].detach().exp().mean()} if "g" in gates else {})
        if documents is not None and documents.shard is not None:  # context parallelism
            if output_state or self.probes is not None:
                raise ValueError("context parallelism: a layer's state cannot be returned or probed (training only)")
            o = chained_recurrence(self.spec.op, q, k, v, gates, documents.shard, documents.cu_seqlens,
                                   scale=self.scale, backend=self.config.backend,
                                   chunk_size=self.config.chunk_size)  # fmt: skip
            recurrent = None
        else:
            o, recurrent = self.spec.op(
                q,
                k,
                v,
                **gates,
                scale=self.scale,
                initial_state=state.recurrent if state is not None else None,
                output_final_state=output_state or self.probes is not None,
                cu_seqlens=None if documents is None else documents.cu_seqlens,
                backend=self.config.backend,
                chunk_size=self.config.chunk_size,
                update_state_in_place=in_place,
            )
        o = self.combine(o, v)
        gate = rearrange(projected["g"], "b t (h d) -> b t h d", h=self.num_heads)
        if self.config.output_multiplier != 1:
            o = o * self.config.output_multiplier
        if self.probes is not None:  # coordinate check: what the recurrence saw and returned
            self.probes.update(gates, q=q, o=o, state=recurrent)
        if fusing_inputs() and self.probes is None:  # decoding: the norm in the output projection's kernel
            y = self.o_proj(self.o_norm.fused_input(o, gate, self.config.backend))
        else:
            y = self.o_proj(rearrange(self.o_norm(o, gate, self.config.backend), "b t h d -> b t (h d)"))
        if in_place:  # the short convs and the recurrence have written into state's buffers
            return y, state
        if not output_state:
            return y, None
        if documents is not None:  # one row per document
            lengths = documents.cu_seqlens.diff().to(x.device)
            conv = {}
            if self.config.use_short_conv:
                inputs = projected.get("streams")
                if inputs is None:  # probed: the streams side by side
                    inputs = torch.cat([projected[name] for name in self.stream_names], dim=-1)
                conv["streams"] = last_inputs_per_document(inputs, documents, self.config.conv_size - 1)
            return y, MixerState(conv=conv, recurrent=recurrent, position=lengths)
        return y, MixerState(conv=new_history, recurrent=recurrent, position=position + x.shape[1])


# Roles of the parameters every mixer has (``registry.ROLES``; their rules: docs/parametrizations.md); cells add
# theirs.
SHARED_ROLES = {
    **{f"{name}.weight": "hidden" for name in ("q_proj", "k_proj", "v_proj", "g_proj", "o_proj")},
    **{f"{name}_conv.weight": "hidden" for name in ("q", "k", "v")},
    "g_proj.0.weight": "hidden",  # a low-rank output gate (output_gate_low_rank)
    "g_proj.1.weight": "hidden",
    "g_proj.1.bias": "bias",
    "o_norm.weight": "norm",
}
