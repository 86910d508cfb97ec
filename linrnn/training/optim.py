"""torchtitan optimizers with the parametrization's per-role learning rates and weight decay.

``TitanLanguageModel.init_weights`` applies the parametrization; this container turns its
``param_groups(lr, weight_decay)`` into torchtitan param groups (one per learning-rate multiplier and decay
setting, matched by exact parameter name), so ``--optimizer.lr`` and ``--optimizer.weight_decay`` stay the base
values of a width sweep and torchtitan's LR schedule scales every group alike.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch
from torchtitan.components.optimizer import OptimizersContainer, ParamGroupConfig


class ParametrizedOptimizers(OptimizersContainer):
    @dataclass(kw_only=True, slots=True)
    class Config(OptimizersContainer.Config):
        name: str = "AdamW"  # "AdamW" or "SGD"
        lr: float = 3e-3
        weight_decay: float = 0.1
        betas: tuple[float, float] = (0.9, 0.95)
        eps: float = 1e-8
        momentum: float = 0.0  # SGD
        nesterov: bool = False  # SGD

    def __init__(self, config: Config, *, model_parts: list[torch.nn.Module]) -> None:
        if config.name not in ("AdamW", "SGD"):
            raise ValueError(f"--optimizer.name must be 'AdamW' or 'SGD', got {config.name!r}")
        (model,) = model_parts
        applied = model.applied
        if applied is None:
            raise RuntimeError("the model's init_weights did not run before the optimizer was built")
        expected = "adamw" if config.name == "AdamW" else "sgd"
        if applied.optimizer != expected:
            raise ValueError(
                f"the model was parametrized for {applied.optimizer!r} but --optimizer.name is "
                f"{config.name!r}; choose a config built for {config.name}"
            )
        if config.name == "AdamW":
            options = {"betas": tuple(config.betas), "eps": config.eps}
        else:
            options = {"momentum": config.momentum, "nesterov": config.nesterov}
        groups = []
        for group in applied.param_groups(config.lr, config.weight_decay):
            names = "|".join(re.escape(f"model.{name}") for name in group["names"])
            kwargs = {"lr": group["lr"], "weight_decay": group["weight_decay"], **options}
            groups.append(
                ParamGroupConfig(pattern=f"^(?:{names})$", optimizer_name=config.name, optimizer_kwargs=kwargs)
            )
        super().__init__(replace(config, param_groups=groups), model_parts=model_parts)

    @staticmethod
    def _resolve_optimizer_factory(name: str):
        if name == "SGD":
            return torch.optim.SGD
        return OptimizersContainer._resolve_optimizer_factory(name)
