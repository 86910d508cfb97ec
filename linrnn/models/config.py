"""Model configuration (pydantic) and the one table of named model sizes (``PRESETS``), which the training
sizes (``linrnn train --size``, ``linrnn.training.names``) read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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


@dataclass(frozen=True)
class TrainingRecipe:
    """How ``linrnn train --size NAME`` and the torchtitan configs ``{cell}_{NAME}_{param}`` train a size
    (``linrnn.training.names``, ``linrnn.training.configs``): the model is the preset of the same name with
    ``vocab_size`` set to the tokenizer's (``overrides``)."""

    vocab: int  # the embedded corpus's tokenizer (4096 or 32000 tokens): the trained model's vocab_size
    seq_len: int
    batch: int  # per rank
    lr: float  # AdamW
    base_width: int = 256  # muP's base width
    steps: int = 2000
    checkpoint_interval: int = 500
    training_fields: Mapping[str, Any] = field(default_factory=dict)  # ModelConfig fields for training only

    @property
    def overrides(self) -> dict[str, Any]:
        """The ModelConfig fields over the preset in training: the tokenizer's ``vocab_size``, then
        ``training_fields``."""
        return {"vocab_size": self.vocab, **self.training_fields}


@dataclass(frozen=True)
class Preset:
    """A named model size: its ModelConfig fields, and how linrnn trains it (None: ``linrnn train`` does not)."""

    fields: Mapping[str, Any]  # vocab_size, hidden_size, num_layers, num_heads[, intermediate_size]
    training: TrainingRecipe | None = None

    def __call__(self) -> dict[str, Any]:
        """The ModelConfig fields, a fresh dict (``PRESETS[name]()``)."""
        return dict(self.fields)


def _llama_mlp(width: int) -> int:
    """SwiGLU width 8/3 × hidden, rounded up to a multiple of 256."""
    return -(-8 * width // 3 // 256) * 256


PAPER_WIDTHS = (256, 384, 512, 768, 1024, 1536)
# The one table of model sizes: build_model(preset=NAME), `linrnn presets`, and the training sizes (`linrnn train
# --size NAME`, config names {cell}_{NAME}_{param}), which are the presets with a training recipe
PRESETS: dict[str, Preset] = {
    # CPU tests and demos: byte vocabulary, two layers; not a training size (the corpus has no byte tokenizer)
    "byte-tiny": Preset(dict(vocab_size=256, hidden_size=64, num_layers=2, num_heads=2)),
    # linrnn train's default, on a CPU: 4 layers, width 128, the corpus's 4096-token tokenizer
    "tiny": Preset(
        dict(vocab_size=4096, hidden_size=128, num_layers=4, num_heads=2, intermediate_size=512),
        TrainingRecipe(4096, 256, 16, 3e-3, base_width=64, steps=300, checkpoint_interval=100),
    ),
    **{
        f"paper-{width}": Preset(
            # the GDN-muP paper's family (docs/design.md, "Sources"): 8 layers, 6 heads, head dims 0.75/1.5 × width
            # / 6, MLP 4 × width, tied embeddings, a 50304-token vocabulary; trained with the corpus's 4096-token
            # tokenizer
            dict(vocab_size=50304, hidden_size=width, num_layers=8, num_heads=6, intermediate_size=4 * width),
            TrainingRecipe(4096, 512, 16, 3e-3),
        )
        for width in PAPER_WIDTHS
    },
    # ~340M parameters with a 32k vocabulary (FLA's 340M scale); 6 heads: K = 128, V = 256 per head, which the Triton
    # kernels take (they hold a head's state tile in registers, K and V at most 256)
    "340m": Preset(
        dict(vocab_size=32000, hidden_size=1024, num_layers=21, num_heads=6, intermediate_size=_llama_mlp(1024)),
        TrainingRecipe(32000, 4096, 4, 1e-3),
    ),
    # ~1.3B parameters with a 32k vocabulary; 12 heads: K = 128, V = 256 per head; trained with activations recomputed
    "1.3b": Preset(
        dict(vocab_size=32000, hidden_size=2048, num_layers=20, num_heads=12, intermediate_size=_llama_mlp(2048)),
        TrainingRecipe(32000, 4096, 4, 6e-4, training_fields={"checkpoint_activations": True}),
    ),
}
# The one table of older spellings of preset and training-size names, accepted everywhere a size is named
# (build_model, linrnn train --size, config names) but not listed
PRESET_ALIASES = {f"paper{width}": f"paper-{width}" for width in PAPER_WIDTHS}


def list_presets() -> list[str]:
    """The canonical preset names, smallest first (older spellings such as ``paper256`` are accepted by
    ``model_config`` but not listed)."""
    return list(PRESETS)


def training_sizes() -> list[str]:
    """The presets ``linrnn train --size`` and the torchtitan configs take: those with a training recipe."""
    return [name for name, preset in PRESETS.items() if preset.training is not None]


def canonical_preset(name: str, argument: str = "'preset'") -> str:
    """``name``'s canonical spelling (``paper256`` → ``paper-256``). An unknown name is a ``UsageError`` naming
    ``argument``, the presets and ``name``."""
    canonical = PRESET_ALIASES.get(name, name) if isinstance(name, str) else None
    if canonical not in PRESETS:
        raise UsageError(f"argument {argument}: expected one of {', '.join(PRESETS)}, got {name!r}")
    return canonical


def canonical_training_size(name: str, argument: str = "'size'") -> str:
    """``name``'s canonical spelling if it is a training size (``training_sizes``), else a ``UsageError`` naming
    ``argument``, the training sizes and ``name``."""
    canonical = PRESET_ALIASES.get(name, name) if isinstance(name, str) else None
    sizes = training_sizes()
    if canonical not in sizes:
        untrained = f" (the preset {canonical!r} has no training recipe)" if canonical in PRESETS else ""
        raise UsageError(f"argument {argument}: expected one of {', '.join(sizes)}, got {name!r}{untrained}")
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
