"""Width-scaling parametrizations (SP, muP, GDN-muP) for any cell, by parameter role.

::

    from linrnn import parametrizations
    parametrizations.list_parametrizations()              # ['gdn-mup', 'mup', 'sp']
    parametrizations.register(MyParametrization())        # a Parametrization subclass: apply, coord-check, sweep
    applied = parametrizations.apply(model, "gdn-mup", base_width=128, optimizer="sgd")
    optimizer = torch.optim.SGD(applied.param_groups(lr=0.3), momentum=0.98, nesterov=True)

``apply`` re-initialises the model per role and shape, sets the logit multiplier (and optionally the GDN-muP
paper's pre-norm multiplier) and returns the per-parameter rules; ``coord_check`` is the standard muP verification.
Tables and derivations: docs/parametrizations.md.
"""

from __future__ import annotations

from torch import nn

from linrnn.errors import UsageError
from linrnn.parametrizations.base import Applied, Optimizer, Parametrization, Rule, Shape
from linrnn.parametrizations.base import apply as _apply
from linrnn.parametrizations.gdn_mup import GdnMuP
from linrnn.parametrizations.mup import MuP
from linrnn.parametrizations.sp import StandardParametrization

_REGISTRY: dict[str, Parametrization] = {p.name: p for p in (StandardParametrization(), MuP(), GdnMuP())}
ALIASES = {"gdnmup": "gdn-mup", "gdn_mup": "gdn-mup"}  # other spellings accepted wherever a name is looked up


def list_parametrizations() -> list[str]:
    return sorted(_REGISTRY)


def register(parametrization: Parametrization) -> None:
    """Adds a ``Parametrization`` (a subclass with ``name`` and ``rule``) for ``apply``, the coordinate check and
    ``linrnn sweep``. Registering the same class under the same name again is a no-op (a re-imported script)."""
    if not isinstance(parametrization, Parametrization) or not parametrization.name:
        raise ValueError(f"register: expected a Parametrization with a name, got {parametrization!r}")
    if parametrization.name in ALIASES:
        raise ValueError(
            f"register: the name {parametrization.name!r} is an alias of {ALIASES[parametrization.name]!r}"
        )
    known = _REGISTRY.get(parametrization.name)
    if known is not None and type(known) is not type(parametrization):
        raise ValueError(f"register: the name {parametrization.name!r} is taken by {type(known).__name__}")
    _REGISTRY[parametrization.name] = parametrization


def get(name: str) -> Parametrization:
    """The parametrization registered as ``name`` (or an alias of it: ``gdnmup``, ``gdn_mup`` → ``gdn-mup``)."""
    found = _REGISTRY.get(ALIASES.get(name, name))
    if found is None:
        raise UsageError(f"unknown parametrization {name!r}; known: {', '.join(list_parametrizations())}")
    return found


def apply(model: nn.Module, name: str, *, base_width: int, optimizer: Optimizer = "adamw",
          pre_norm_multiplier: bool | None = None, readout_zero_init: bool = False,
          base_num_heads: int | None = None) -> Applied:  # fmt: skip
    """Applies parametrization ``name`` to a ``LanguageModel`` whose width is ``model.config.hidden_size``,
    relative to ``base_width``; returns the rules, with ``param_groups(lr, weight_decay)`` for an optimizer.
    ``pre_norm_multiplier``: the GDN-muP paper's §4.3 multiplier before the output RMSNorm (default on for mup,
    gdn-mup); ``readout_zero_init``: an untied readout starts at zero (every parametrization alike);
    ``base_num_heads``: the base model's head count where heads grow with width (default: the model's)."""
    return _apply(model, get(name), base_width=base_width, optimizer=optimizer, pre_norm_multiplier=pre_norm_multiplier,
                  readout_zero_init=readout_zero_init, base_num_heads=base_num_heads)  # fmt: skip


__all__ = [
    "ALIASES",
    "Applied",
    "Parametrization",
    "Rule",
    "Shape",
    "apply",
    "get",
    "list_parametrizations",
    "register",
]
