"""Registry of token mixers: name → ``CellSpec``, the one place a cell is described.

A spec states the recurrence's structure (``linrnn.kernels.structure.Structure``: decay, erase, gates,
conjugation), from which everything else reads the cell: its op and the op's input checks (``CellSpec.op``), its
equation, its stability transition and certificate (``linrnn.stability``), its gate inputs and parameter roles
(``linrnn.parametrizations``), training config names (``linrnn.training.names``), its FLA counterpart, the CLI's
lists and the tests' parametrisation. ``register_cell`` adds a user's cell from the user's own file.

Two kinds: the recurrence cells (``list_cells``) and softmax attention (a spec without a structure, the Transformer
baseline). ``list_mixers`` lists both; ``get_cell``, ``build_mixer``, ``ModelConfig(cell=...)`` and ``param_roles``
take either."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import Tensor, nn

from linrnn.errors import UsageError
from linrnn.kernels import ops
from linrnn.kernels.structure import Certificate, Structure, certificate
from linrnn.recurrences.base import SHARED_ROLES, LinearRNNMixer, MixerConfig, MixerOptions

ROLES = ("embedding", "hidden", "gate", "gate_scalar", "norm", "bias", "readout", "gamma")


@dataclass(frozen=True)
class CellSpec:
    """A token mixer: its name, layer class, recurrence structure (None: attention), parameter roles and defaults."""

    name: str
    mixer: type[nn.Module]  # a LinearRNNMixer subclass for recurrences; called as mixer(MixerConfig)
    structure: Structure | None  # None: not a recurrence (attention)
    cell_roles: dict[str, str]  # roles of the parameters this cell adds to the shared mixer (attention: all of them)
    defaults: dict[str, object] = field(default_factory=dict)  # MixerOptions this cell sets differently
    aliases: tuple[str, ...] = ()
    description: str = ""  # one line: what the cell is
    equation: str | None = None  # attention's output; a recurrence's comes from its structure
    fla: str | None = None  # the model_type of FLA's model with this mixer's layout, if any
    unused_options: frozenset[str] = frozenset()  # MixerOptions the mixer does not read: build_mixer refuses them
    # defaults that depend on the width: (hidden_size, num_heads, the options given) → MixerOptions
    sized_defaults: Callable[[int, int, dict[str, Any]], dict[str, Any]] | None = None

    @property
    def kind(self) -> str:
        return "attention" if self.structure is None else "recurrence"

    @property
    def decay(self) -> str | None:
        return None if self.structure is None else self.structure.decay

    @property
    def erase(self) -> str | None:
        return None if self.structure is None else self.structure.erase

    @property
    def recurrence(self) -> str:
        """The state update in FLA orientation (attention: its output), for docs and tables."""
        return self.equation if self.structure is None else self.structure.equation()

    @property
    def certificate(self) -> Certificate | None:
        return None if self.structure is None else certificate(self.structure)

    @property
    def config_name(self) -> str:
        """The cell's name in training config names: its first alias (``gdn``), else its name."""
        return self.aliases[0] if self.aliases else self.name

    @property
    def gate_inputs(self) -> tuple[str, ...]:
        """The cell's own projections of the layer input (``<name>_proj``)."""
        return tuple(getattr(self.mixer, "gate_inputs", ()))

    @property
    def roles(self) -> dict[str, str]:
        """{parameter name inside the mixer: role} for every parameter the mixer can have (recurrences share
        ``SHARED_ROLES``; attention declares its own)."""
        return {**SHARED_ROLES, **self.cell_roles} if self.kind == "recurrence" else dict(self.cell_roles)

    def op(self, q: Tensor, k: Tensor, v: Tensor, **inputs: Any) -> tuple[Tensor, Tensor | None]:
        """The cell's recurrence: ``op(q, k, v, <structure.input_names()>=..., <ops options>)`` → (o, final
        state), with the checks of ``linrnn.ops`` (each error names the argument, the expected and the actual)."""
        if self.structure is None:
            raise UsageError(f"{self.name} is not a recurrence: it has no op")
        given = {name: inputs.pop(name) for name in list(inputs) if name not in ops.OPTIONS}
        return ops.run(self.structure, f"cell {self.name!r}", q, k, v, given, ops.parse_options(inputs))


_CELLS: dict[str, CellSpec] = {}
_ALIASES: dict[str, str] = {}


def register_cell(spec: CellSpec) -> CellSpec:
    """Adds ``spec`` to the registry; returns it. For a recurrence, ``spec.mixer`` subclasses ``LinearRNNMixer``.
    Every part of linrnn then takes the name: ``build_model``, ``get_cell(name).op``, ``linrnn.stability``,
    ``linrnn.parametrizations``, the training configs and ``linrnn eval``."""
    if not isinstance(spec, CellSpec):
        raise UsageError(f"register_cell: expected a CellSpec, got {type(spec).__name__}")
    taken = [name for name in (spec.name, *spec.aliases) if name in _CELLS or name in _ALIASES]
    if taken:
        raise UsageError(f"register_cell: name {taken[0]!r} is taken (registered: {', '.join(sorted(_CELLS))}); "
                         f"unregister_cell it first")  # fmt: skip
    unknown = sorted(set(spec.cell_roles.values()) - set(ROLES))
    if unknown:
        raise UsageError(f"register_cell({spec.name!r}): unknown roles {unknown}; known roles are {list(ROLES)}")
    if spec.structure is not None and not (isinstance(spec.mixer, type) and issubclass(spec.mixer, LinearRNNMixer)):
        raise UsageError(f"register_cell({spec.name!r}): a recurrence's mixer must subclass LinearRNNMixer, got "
                         f"{spec.mixer!r}")  # fmt: skip
    if "spec" in vars(spec.mixer):
        raise UsageError(f"register_cell({spec.name!r}): {spec.mixer.__name__} is already registered as "
                         f"{spec.mixer.spec.name!r}; subclass it for a second cell")  # fmt: skip
    spec.mixer.spec = spec
    spec.mixer.cell = spec.name
    _CELLS[spec.name] = spec
    for alias in spec.aliases:
        _ALIASES[alias] = spec.name
    return spec


def unregister_cell(name: str) -> None:
    """Removes a registered cell and its aliases (tests register cells of their own)."""
    spec = get_cell(name)
    del _CELLS[spec.name]
    for alias in spec.aliases:
        del _ALIASES[alias]
    del spec.mixer.spec, spec.mixer.cell


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
