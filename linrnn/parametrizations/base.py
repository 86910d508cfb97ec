"""Width-scaling rules applied by parameter role and by which of a parameter's dimensions grow with width.

A parametrization answers, for one parameter, three questions as functions of the width multipliers (``m`` =
width / base width; ``m_in``, ``m_out`` = fan-in and fan-out over their base values): its init std (relative to
the SP std ``init_std``, or "keep the module's own init"), its learning-rate multiplier, and the model's forward
multipliers (the logit multiplier and the optional pre-norm multiplier). Which dimensions grow is read off a copy
of the model's config at the base width (built on the meta device), as the mup package does with base shapes:
a dimension is "infinite" when it differs from the base model's.

Shape classes (Tensor Programs V): a matrix is *hidden* when fan-in and fan-out both grow, *input-like* when only
fan-out grows (embeddings, short convs, a low-rank factor of fixed rank into the model width), *output-like*
when only fan-in grows (the readout, GDN's W_α and W_β with one output per head); a vector is infinite or finite.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from linrnn.recurrences.base import LinearRNNMixer
from linrnn.recurrences.registry import param_roles

Optimizer = Literal["adamw", "sgd"]
NO_DECAY_ROLES = ("norm", "bias", "gate_scalar", "gamma")


@dataclass(frozen=True)
class Shape:
    """How one parameter scales: fan-in / fan-out multipliers (1 = does not grow) and whether it is a matrix."""

    matrix: bool
    m_in: float  # fan-in / base fan-in (matrices); 1 for vectors
    m_out: float  # fan-out / base fan-out, or size / base size for vectors

    @property
    def grows_in(self) -> bool:
        return self.m_in != 1


@dataclass(frozen=True)
class Rule:
    """What a parametrization does to one parameter: init std as a multiple of ``init_std`` (None: keep the
    module's own init), learning-rate multiplier."""

    init_scale: float | None
    lr: float


class Parametrization:
    """Base class: ``rule(role, shape, m, optimizer)`` per parameter and the forward multipliers."""

    name: str = ""
    description: str = ""

    def rule(self, role: str, shape: Shape, m: float, optimizer: Optimizer) -> Rule:
        raise NotImplementedError

    pre_norm_multiplier: bool = False  # the default of ``apply``'s option

    def logit_multiplier(self, m: float) -> float:
        return 1.0


@dataclass
class Applied:
    """What ``apply`` did: per parameter its role, shape, rule; ``param_groups`` feeds a torch optimizer."""

    parametrization: str
    optimizer: Optimizer
    base_width: int
    width: int
    roles: dict[str, str]
    shapes: dict[str, Shape]
    rules: dict[str, Rule]
    model: nn.Module

    def lr_multipliers(self) -> dict[str, float]:
        return {name: rule.lr for name, rule in self.rules.items()}

    def param_groups(self, lr: float, weight_decay: float = 0.0) -> list[dict]:
        """One group per (learning-rate multiplier, decayed or not), each with ``lr`` × multiplier.

        Weight decay is off for norms, biases, gate scalars and log Γ. Elsewhere it is *independent* of the learning
        rate multiplier: a group's ``weight_decay`` is ``weight_decay / multiplier``, so the decay per step
        (torch applies ``lr · weight_decay``, decoupled in AdamW, as L2 in SGD) is ``lr · weight_decay`` at every
        width. Scaling it with the group's lr instead would switch decay off as width grows under muP.
        """
        groups: dict[tuple[float, bool], dict] = {}
        parameters = dict(self.model.named_parameters())
        for name, rule in self.rules.items():
            decays = self.roles[name] not in NO_DECAY_ROLES and weight_decay > 0
            key = (rule.lr, decays)
            if key not in groups:
                groups[key] = {
                    "params": [],
                    "names": [],
                    "lr": lr * rule.lr,
                    "weight_decay": weight_decay / rule.lr if decays else 0.0,
                }
            groups[key]["params"].append(parameters[name])
            groups[key]["names"].append(name)
        return list(groups.values())


MATRIX_ROLES = ("embedding", "hidden", "gate", "readout")  # the others are vectors, whatever their rank (log Γ: [H, K])


def shapes_against_base(model: nn.Module, base_model: nn.Module, roles: dict[str, str]) -> dict[str, Shape]:
    """Per parameter, how its fan-in and fan-out compare with the base model's (same names)."""
    base = dict(base_model.named_parameters())
    shapes = {}
    for name, p in model.named_parameters():
        if name not in base or base[name].dim() != p.dim():
            raise ValueError(f"parameter {name!r} has no counterpart of the same rank in the base-width model")
        b = base[name]
        if roles[name] in MATRIX_ROLES and p.dim() >= 2:  # Linear [out, in], Embedding [vocab, dim], conv [C, 1, W]
            fan_out, fan_in = _fans(name, p.shape)
            base_out, base_in = _fans(name, b.shape)
            shapes[name] = Shape(matrix=True, m_in=fan_in / base_in, m_out=fan_out / base_out)
        else:
            shapes[name] = Shape(matrix=False, m_in=1.0, m_out=p.numel() / max(b.numel(), 1))
    return shapes


def _fans(name: str, shape: torch.Size) -> tuple[int, int]:
    if name.endswith("embed.weight"):  # [vocab, dim]: maps the finite vocabulary into the width
        return shape[1], shape[0]
    return shape[0], math.prod(shape[1:])


def apply(
    model: nn.Module,
    parametrization: Parametrization,
    *,
    base_width: int,
    optimizer: Optimizer = "adamw",
    pre_norm_multiplier: bool | None = None,
    readout_zero_init: bool = False,
    base_num_heads: int | None = None,
) -> Applied:
    """Re-initialises ``model`` (a ``LanguageModel``) per role, installs the multipliers and returns the rules.
    ``pre_norm_multiplier`` (default: the parametrization's) switches the GDN-muP paper's §4.3 multiplier on or off.
    ``readout_zero_init`` starts an untied readout at zero (Tensor Programs V's recommendation under muP, where a
    random readout's logits vanish at init as m^(-1/2)); it does the same under every parametrization, so the base
    width still gives one model. ``base_num_heads`` (default: the model's) is the base model's head count, for
    models whose heads grow with width at fixed head dimensions."""
    from linrnn.models import LanguageModel, ModelConfig

    if not isinstance(model, LanguageModel):
        raise ValueError(f"apply: argument 'model' must be a linrnn LanguageModel, got {type(model).__name__}")
    if optimizer not in ("adamw", "sgd"):
        raise ValueError(f"apply: argument 'optimizer' must be 'adamw' or 'sgd', got {optimizer!r}")
    if not isinstance(base_width, int) or base_width < 1:
        raise ValueError(f"apply: argument 'base_width' must be a positive integer, got {base_width!r}")
    if base_num_heads is not None and (not isinstance(base_num_heads, int) or base_num_heads < 1):
        raise ValueError(f"apply: argument 'base_num_heads' must be a positive integer or None, got {base_num_heads!r}")
    roles = param_roles(model)  # raises for a parameter without a role
    config = model.config
    if readout_zero_init and config.tie_embeddings:
        raise ValueError("apply: readout_zero_init=True needs an untied readout, got tie_embeddings=True "
                         "(it would zero the embedding)")  # fmt: skip
    base_values = config.model_dump()
    base_values["hidden_size"] = base_width
    base_values["intermediate_size"] = round(config.intermediate_size * base_width / config.hidden_size)
    if base_num_heads is not None:
        base_values["num_heads"] = base_num_heads
    try:
        base_config = ModelConfig(**base_values)
        with torch.device("meta"):
            base_model = LanguageModel(base_config)
    except ValueError as error:
        raise ValueError(f"apply: no base model at base_width = {base_width}: {error}") from None
    shapes = shapes_against_base(model, base_model, roles)
    m = config.hidden_size / base_width
    rules = {name: parametrization.rule(roles[name], shapes[name], m, optimizer) for name in roles}
    _reinitialise(model, rules, config.init_std)
    if readout_zero_init:
        with torch.no_grad():
            model.lm_head.weight.zero_()
    model.config.logit_multiplier = parametrization.logit_multiplier(m)
    if pre_norm_multiplier is None:
        pre_norm_multiplier = parametrization.pre_norm_multiplier
    for layer, base_layer in zip(model.layers, base_model.layers, strict=True):
        if not isinstance(layer.mixer, LinearRNNMixer):  # attention: no output RMSNorm for the multiplier to precede
            continue
        # GDN-muP paper §4.3 relative to the base width: with q̂ independent of S (its App. C.4; measured in
        # docs/parametrizations.md) the read Sᵀq̂ is Θ(1/√d_k), and the kernels' query scale 1/√d_k makes o Θ(1/d_k)
        multiplier = layer.mixer.head_k_dim / base_layer.mixer.head_k_dim if pre_norm_multiplier else 1.0
        layer.mixer.config.output_multiplier = multiplier
        model.config.mixer["output_multiplier"] = multiplier  # the same in every layer: a checkpoint rebuilds it
    return Applied(parametrization.name, optimizer, base_width, config.hidden_size, roles, shapes, rules, model)


@torch.no_grad()
def _reinitialise(model: nn.Module, rules: dict[str, Rule], init_std: float) -> None:
    """Linear and embedding weights ~ N(0, (init_std · init_scale)²), Linear biases 0, in module order (so every
    parametrization draws the same random numbers); other parameters keep their own init."""
    for module_name, module in model.named_modules():
        if not isinstance(module, (nn.Linear, nn.Embedding)):
            continue
        name = f"{module_name}.weight" if module_name else "weight"
        scale = rules[name].init_scale if name in rules else None
        if scale is not None:
            module.weight.normal_(0.0, init_std * scale)
        if isinstance(module, nn.Linear) and module.bias is not None:
            module.bias.zero_()
