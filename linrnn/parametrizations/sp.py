"""SP: every matrix ~ N(0, init_std²) at every width, one learning rate, no multipliers (the GDN-muP paper's
baseline)."""

from __future__ import annotations

from linrnn.parametrizations.base import Optimizer, Parametrization, Rule, Shape


class StandardParametrization(Parametrization):
    name = "sp"
    description = "standard: fixed init std, one learning rate, no multipliers"

    def rule(self, role: str, shape: Shape, m: float, optimizer: Optimizer) -> Rule:
        return Rule(init_scale=1.0 if shape.matrix else None, lr=1.0)
