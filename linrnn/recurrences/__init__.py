"""Token mixers: one file per recurrence cell, and softmax attention, each registering a ``CellSpec``."""

from linrnn.recurrences import (  # noqa: F401  (registration)
    attention,
    deltanet,
    gammanet,
    gated_deltanet,
    gdn2,
    gla,
    kda,
    mamba2,
)
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig, MixerOptions, MixerState
from linrnn.recurrences.registry import (
    ROLES,
    CellSpec,
    build_mixer,
    get_cell,
    list_cells,
    list_mixers,
    param_roles,
    register_cell,
    unregister_cell,
)

__all__ = [
    "ROLES",
    "CellSpec",
    "LinearRNNMixer",
    "MixerConfig",
    "MixerOptions",
    "MixerState",
    "build_mixer",
    "get_cell",
    "list_cells",
    "list_mixers",
    "param_roles",
    "register_cell",
    "unregister_cell",
]
