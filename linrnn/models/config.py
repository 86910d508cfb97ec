"""Model configuration (pydantic) and named presets."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from linrnn.errors import UsageError
from linrnn.recurrences.base import MixerOptions
from linrnn.recurrences.registry import canonical_name, get_cell


class ModelConfig(BaseModel):
    """The generic LM: embedding → num_layers × [RMSNorm, mixer, +, RMSNorm, SwiGLU, +] → RMSNorm → readout."""

    model_config = ConfigDict(extra="forbid")

    cell: str
    vocab_size: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    num_layers: int = Field(gt=0)
    num_heads: int = Field(gt=0)
    intermediate_size: int | None = Field(None, gt=0, description="SwiGLU width; default 4 * hidden_size")
    tie_embeddings: bool = True
    norm_eps: float = Field(1e-6, gt=0)
    init_std: float = Field(0.02, gt=0)
    conv_init: Literal["normal", "uniform"] = Field(
        "normal",
        description="short-conv weights: 'normal' N(0, init_std²) like every other matrix, as FLA's models (learns "
        "more per token: docs/evaluation.md, 'Learning parity with FLA'); 'uniform' PyTorch's Conv1d default "
        "U(±1/√conv_size), linrnn's earlier default",
    )
    logit_multiplier: float = Field(1.0, gt=0, description="multiplies the logits (muP: base_width / width)")
    readout_bias: bool = Field(False, description="a learned bias per vocabulary entry, added after logit_multiplier")
    checkpoint_activations: bool = Field(False, description="recompute each block in backward (less memory)")
    mixer: dict[str, Any] = Field(default_factory=dict, description="MixerOptions set explicitly")
    layer_pattern: list[str] | None = Field(
        None,
        description="mixers cycled over the layers (a hybrid), e.g. ['gdn', 'gdn', 'gdn', 'attention']: layer i has "
        "layer_pattern[i % len]; None: every layer is `cell`",
    )

    @field_validator("cell")
    @classmethod
    def _known_cell(cls, name: str) -> str:
        return canonical_name(name)

    @field_validator("layer_pattern")
    @classmethod
    def _known_pattern(cls, pattern: list[str] | None) -> list[str] | None:
        if pattern is None:
            return None
        if not pattern:
            raise ValueError("layer_pattern must name at least one mixer, got []")
        return [canonical_name(name) for name in pattern]

    @property
    def layer_cells(self) -> list[str]:
        """The mixer of each layer (canonical names)."""
        if self.layer_pattern is None:
            return [self.cell] * self.num_layers
        return [self.layer_pattern[i % len(self.layer_pattern)] for i in range(self.num_layers)]

    def mixer_options(self, cell: str) -> dict[str, Any]:
        """The ``mixer`` options for a layer of ``cell``. In a hybrid, an option of a part the layer does not have
        (a recurrence's short conv for an attention layer: ``CellSpec.unused_options``) applies to the other layers
        only; a single-mixer model passes them all (``build_mixer`` refuses what does not apply)."""
        if len(set(self.layer_cells)) == 1:
            return dict(self.mixer)
        unused = get_cell(cell).unused_options
        return {name: value for name, value in self.mixer.items() if name not in unused}

    @field_validator("mixer")
    @classmethod
    def _mixer_options(cls, options: dict[str, Any]) -> dict[str, Any]:
        MixerOptions(**options)  # validates names and values
        return options

    @model_validator(mode="after")
    def _defaults(self) -> ModelConfig:
        if self.intermediate_size is None:
            self.intermediate_size = 4 * self.hidden_size
        return self


def _byte_tiny() -> dict[str, Any]:
    """CPU tests and demos: byte vocabulary, two layers."""
    return dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=2)


def _paper(width: int) -> Callable[[], dict[str, Any]]:
    """Seed 000's family: 8 layers, 6 heads, head dims 0.75/1.5 × width / 6, MLP 4 × width, tied embeddings."""

    def preset() -> dict[str, Any]:
        return dict(vocab_size=50304, hidden_size=width, num_layers=8, num_heads=6, intermediate_size=4 * width)

    preset.__doc__ = f"GDN-muP paper family at width {width}."
    return preset


def _llama_mlp(width: int) -> int:
    """SwiGLU width 8/3 × hidden, rounded up to a multiple of 256."""
    return -(-8 * width // 3 // 256) * 256


def _m340() -> dict[str, Any]:
    """~340M parameters with a 32k vocabulary (FLA's 340M scale); 6 heads: K = 128, V = 256 per head, which the
    Triton kernels take (they hold a head's state tile in registers, K and V at most 256)."""
    return dict(vocab_size=32000, hidden_size=1024, num_layers=21, num_heads=6, intermediate_size=_llama_mlp(1024))


def _b1_3() -> dict[str, Any]:
    """~1.3B parameters with a 32k vocabulary; 12 heads: K = 128, V = 256 per head."""
    return dict(vocab_size=32000, hidden_size=2048, num_layers=20, num_heads=12, intermediate_size=_llama_mlp(2048))


PAPER_WIDTHS = (256, 384, 512, 768, 1024, 1536)
PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "byte-tiny": _byte_tiny,
    **{f"paper-{width}": _paper(width) for width in PAPER_WIDTHS},
    "340m": _m340,
    "1.3b": _b1_3,
}
# Older spellings, still accepted: "tiny" was renamed so as not to be confused with linrnn train's size "tiny"
PRESET_ALIASES = {"tiny": "byte-tiny", **{f"paper{width}": f"paper-{width}" for width in PAPER_WIDTHS}}


def list_presets() -> list[str]:
    """The canonical preset names (aliases such as ``tiny`` are accepted by ``model_config`` but not listed)."""
    return list(PRESETS)


def canonical_preset(name: str) -> str:
    """``name``'s canonical spelling (``tiny`` → ``byte-tiny``, ``paper256`` → ``paper-256``)."""
    canonical = PRESET_ALIASES.get(name, name)
    if canonical not in PRESETS:
        raise UsageError(f"unknown preset {name!r}; known presets: {', '.join(PRESETS)}")
    return canonical


def model_config(cell: str, preset: str = "byte-tiny", **overrides: Any) -> ModelConfig:
    """Preset values, then ``overrides``: ModelConfig fields, or MixerOptions fields (go to ``mixer``)."""
    values = PRESETS[canonical_preset(preset)]()
    mixer = dict(overrides.pop("mixer", {}))
    for name, value in overrides.items():
        if name in ModelConfig.model_fields:
            values[name] = value
        elif name in MixerOptions.model_fields:
            mixer[name] = value
        else:
            known = sorted((set(ModelConfig.model_fields) | set(MixerOptions.model_fields)) - {"mixer", "cell"})
            raise UsageError(f"unknown model option {name!r}; known options: {', '.join(known)}")
    return ModelConfig(cell=cell, mixer=mixer, **values)
