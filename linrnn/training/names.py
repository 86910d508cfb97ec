"""The names of linrnn's training configs, ``{cell}_{size}_{parametrization}``, and each size's settings (read
from the one table of model sizes, ``linrnn.models.config.PRESETS``); no torchtitan import, so ``linrnn train``
checks its arguments before loading it (``linrnn.training.configs`` builds the configs)."""

from __future__ import annotations

from linrnn import parametrizations
from linrnn.models.config import (  # noqa: F401  (canonical_training_size: re-exported)
    PRESET_ALIASES,
    PRESETS,
    TrainingRecipe,
    canonical_training_size,
    training_sizes,
)
from linrnn.recurrences.registry import get_cell, list_mixers

# hybrid models by name: the layer pattern cycled over the layers (ModelConfig.layer_pattern). Three delta-rule
# layers to one attention layer, as Qwen3-Next (Gated DeltaNet) and Kimi Linear (KDA) build theirs
HYBRIDS = {
    "gdn-hybrid": ("gated_deltanet", "gated_deltanet", "gated_deltanet", "attention"),
    "kda-hybrid": ("kda", "kda", "kda", "attention"),
}


def cells() -> dict[str, str]:
    """{name in config names: registry name (a hybrid: its own name)} for every registered mixer
    (``CellSpec.config_name``: ``gdn`` for Gated DeltaNet) and every hybrid in ``HYBRIDS``, read from the registry
    when called, so cells registered later are included."""
    return {**{get_cell(name).config_name: name for name in list_mixers()}, **{name: name for name in HYBRIDS}}


def resolve_cell(name: str) -> tuple[str, list[str] | None]:
    """(the model's ``cell``, its ``layer_pattern`` or None) for a registry name or a hybrid's name."""
    if name in HYBRIDS:
        return HYBRIDS[name][0], list(HYBRIDS[name])
    return name, None


PARAMETRIZATIONS = {"sp": "sp", "mup": "mup", "gdn-mup": "gdn-mup"}
# Older spellings, still accepted in config names and ``linrnn train`` flags: the alias tables of the names' owners
# (cells: ``CellSpec.aliases``), not copies
SIZE_ALIASES = PRESET_ALIASES  # linrnn.models.config: paper256 → paper-256
PARAMETRIZATION_ALIASES = parametrizations.ALIASES  # gdnmup, gdn_mup → gdn-mup

# The training sizes are the model presets that have a training recipe (linrnn.models.config.PRESETS, the one table
# of sizes): size NAME trains preset NAME with the tokenizer's vocab_size, ``SIZES[NAME].overrides``
Size = TrainingRecipe  # the name linrnn.training.configs has exported
SIZES: dict[str, TrainingRecipe] = {name: PRESETS[name].training for name in training_sizes()}


def config_names() -> list[str]:
    return [f"{cell}_{size}_{param}" for cell in cells() for size in SIZES for param in PARAMETRIZATIONS]


def parse_config_name(name: str) -> tuple[str, str, str] | None:
    """(cell, size, parametrization) of a config name, older spellings of the size and parametrization replaced
    (``gdn_paper256_gdnmup`` → ``("gdn", "paper-256", "gdn-mup")``), or None if it names no config."""
    parts = name.split("_")
    known = cells()
    for i in range(1, len(parts) - 1):  # sizes and parametrizations may contain underscores ("gdn_mup")
        for j in range(i + 1, len(parts)):
            cell, size, param = "_".join(parts[:i]), "_".join(parts[i:j]), "_".join(parts[j:])
            size, param = SIZE_ALIASES.get(size, size), PARAMETRIZATION_ALIASES.get(param, param)
            if cell in known and size in SIZES and param in PARAMETRIZATIONS:
                return cell, size, param
    return None


def canonical_config_name(name: str) -> str | None:
    """``name`` with older spellings of its size and parametrization replaced, or None if it names no config."""
    parsed = parse_config_name(name)
    return None if parsed is None else "_".join(parsed)
