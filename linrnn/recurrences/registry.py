"""Registry of token mixers: name → spec (kind, decay kind, erase kind, parameter roles, defaults, mixer class).

Two kinds: the recurrence cells (``list_cells``: what the kernels, the stability checker and the per-cell demos and
tests iterate over) and softmax attention (``kind="attention"``, the Transformer baseline). ``list_mixers`` lists
both; ``get_cell``, ``build_mixer``, ``ModelConfig(cell=...)`` and ``param_roles`` take either."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from torch import nn

from linrnn.errors import UsageError
from linrnn.recurrences.base import SHARED_ROLES, MixerConfig, MixerOptions

ROLES = ("embedding", "hidden", "gate", "gate_scalar", "norm", "bias", "readout", "gamma")


@dataclass(frozen=True)
class CellSpec:
    name: str
    mixer: type[nn.Module]  # a LinearRNNMixer subclass for recurrences; called as mixer(MixerConfig)
    decay: Literal["none", "head", "channel"] | None  # None: not a recurrence
    erase: Literal["off", "tied", "decoupled"] | None
    recurrence: str  # the state update in FLA orientation (attention: its output), for docs and tables
    cell_roles: dict[str, str]  # roles of the parameters this cell adds to the shared mixer (attention: all of them)
    defaults: dict[str, object] = field(default_factory=dict)  # MixerOptions this cell sets differently
    aliases: tuple[str, ...] = ()
    kind: Literal["recurrence", "attention"] = "recurrence"
    unused_options: frozenset[str] = frozenset()  # MixerOptions the mixer does not read: build_mixer refuses them
    # defaults that depend on the width: (hidden_size, num_heads, the options given) → MixerOptions
    sized_defaults: Callable[[int, int, dict[str, Any]], dict[str, Any]] | None = None

    @property
    def roles(self) -> dict[str, str]:
        """{parameter name inside the mixer: role} for every parameter the mixer can have (recurrences share
        ``SHARED_ROLES``; attention declares its own)."""
        return {**SHARED_ROLES, **self.cell_roles} if self.kind == "recurrence" else dict(self.cell_roles)


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
    """Canonical names of the recurrence cells, sorted (aliases such as 'gdn' resolve through ``get_cell``);
    attention is not among them (``list_mixers``)."""
    return sorted(name for name, spec in _CELLS.items() if spec.kind == "recurrence")


def list_mixers() -> list[str]:
    """Every registered mixer: the recurrence cells (``list_cells``), then the attention mixers, each sorted."""
    return list_cells() + sorted(name for name, spec in _CELLS.items() if spec.kind != "recurrence")


def canonical_name(name: str) -> str:
    if not isinstance(name, str) or (name not in _CELLS and name not in _ALIASES):
        known = list_cells() + [f"{alias} (= {target})" for alias, target in sorted(_ALIASES.items())]
        others = list_mixers()[len(list_cells()) :]
        raise ValueError(f"unknown cell {name!r}; known cells: {', '.join(known)}; other mixers: {', '.join(others)}")
    return _ALIASES.get(name, name)


def get_cell(name: str) -> CellSpec:
    return _CELLS[canonical_name(name)]


def build_mixer(name: str, hidden_size: int, num_heads: int, **options) -> nn.Module:
    """A mixer layer of cell ``name``; ``options`` are ``MixerOptions`` fields (unknown ones raise, and so do
    options the mixer does not read, ``CellSpec.unused_options``, unless given at the mixer's default)."""
    spec = get_cell(name)
    defaults = {**MixerOptions().model_dump(), **spec.defaults}
    for option in sorted(spec.unused_options & set(options)):
        if options[option] != defaults[option]:
            raise UsageError(
                f"build_mixer: option {option!r} does not apply to {spec.name} (a {spec.kind} mixer); expected it "
                f"unset or {defaults[option]!r}, got {options[option]!r}"
            )
    sized = spec.sized_defaults(hidden_size, num_heads, options) if spec.sized_defaults is not None else {}
    config = MixerConfig(hidden_size=hidden_size, num_heads=num_heads, **{**spec.defaults, **sized, **options})
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
