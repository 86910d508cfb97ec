"""Token mixers: one file per recurrence cell, and softmax attention, each registering a ``CellSpec``."""

from linrnn.recurrences import attention, deltanet, gammanet, gated_deltanet, gla, kda  # noqa: F401  (registration)
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig, MixerOptions, MixerState
from linrnn.recurrences.registry import ROLES, CellSpec, build_mixer, get_cell, list_cells, list_mixers, param_roles

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
]
