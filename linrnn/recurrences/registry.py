"""Registry of recurrence cells: name → spec (decay kind, erase kind, parameter roles, defaults, mixer class)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from torch import nn

from linrnn.recurrences.base import SHARED_ROLES, LinearRNNMixer, MixerConfig

ROLES = ("embedding", "hidden", "gate", "gate_scalar", "norm", "bias", "readout", "gamma")


@dataclass(frozen=True)
class CellSpec:
    name: str
    mixer: type[LinearRNNMixer]
    decay: Literal["none", "head", "channel"]
    erase: Literal["off", "tied", "decoupled"]
    recurrence: str  # the state update in FLA orientation, for docs and tables
    cell_roles: dict[str, str]  # roles of the parameters this cell adds to the shared mixer
    defaults: dict[str, object] = field(default_factory=dict)  # MixerOptions this cell sets differently
    aliases: tuple[str, ...] = ()

    @property
    def roles(self) -> dict[str, str]:
        """{parameter name inside the mixer: role} for every parameter the mixer can have."""
        return {**SHARED_ROLES, **self.cell_roles}


_CELLS: dict[str, CellSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: CellSpec) -> CellSpec:
    unknown = sorted(set(spec.cell_roles.values()) - set(ROLES))
    if unknown:
        raise ValueError(f"cell {spec.name!r}: unknown roles {unknown}; known roles are {list(ROLES)}")
    spec.mixer.cell = spec.name
    _CELLS[spec.name] = spec
    for alias in spec.aliases:
        _ALIASES[alias] = spec.name
    return spec


def list_cells() -> list[str]:
    """Canonical cell names, sorted (aliases such as 'gdn' resolve through ``get_cell``)."""
    return sorted(_CELLS)


def canonical_name(name: str) -> str:
    if not isinstance(name, str) or (name not in _CELLS and name not in _ALIASES):
        known = list_cells() + [f"{alias} (= {target})" for alias, target in sorted(_ALIASES.items())]
        raise ValueError(f"unknown cell {name!r}; known cells: {', '.join(known)}")
    return _ALIASES.get(name, name)


def get_cell(name: str) -> CellSpec:
    return _CELLS[canonical_name(name)]


def build_mixer(name: str, hidden_size: int, num_heads: int, **options) -> LinearRNNMixer:
    """A mixer layer of cell ``name``; ``options`` are ``MixerOptions`` fields (unknown ones raise)."""
    spec = get_cell(name)
    config = MixerConfig(hidden_size=hidden_size, num_heads=num_heads, **{**spec.defaults, **options})
    return spec.mixer(config)


def param_roles(module: nn.Module) -> dict[str, str]:
    """{parameter name: role} for a mixer, a model, or any module made of linrnn parts.

    Modules declare roles for their own parameters through ``local_param_roles()``;
    a parameter nobody declares raises a ValueError naming it.
    """
    roles: dict[str, str] = {}
    for prefix, sub in module.named_modules():
        declare = getattr(sub, "local_param_roles", None)
        if declare is not None:
            roles.update({f"{prefix}.{name}" if prefix else name: role for name, role in declare().items()})
    names = [name for name, _ in module.named_parameters()]
    missing = [name for name in names if name not in roles]
    if missing:
        raise ValueError(f"parameters without a role: {missing}")
    return {name: roles[name] for name in names}
