"""muP (Tensor Programs V, Table 8 form: an output multiplier instead of a 1/fan_in² readout init), relative to
the base width: m = width / base width, m_in / m_out = fan-in / fan-out over their base values.

| parameter | init std | AdamW lr | SGD lr |
|---|---|---|---|
| embedding, input-like matrices (fan-in fixed) | σ | η | η · m_out |
| hidden matrices and gate matrices (fan-in grows) | σ / √m_in | η / m_in | η |
| readout (logits × 1/m) | σ | η | η · m_in |
| vectors: norms, biases, gate scalars, log Γ | own init | η | η · m_out (η if fixed size) |

Plain muP has no rule of its own for gates: W_α, W_β are matrices like any other, and A_log, dt_bias, log Γ are
vectors (biases). Derivations in docs/parametrizations.md.
"""

from __future__ import annotations

import math

from linrnn.parametrizations.base import Optimizer, Parametrization, Rule, Shape


class MuP(Parametrization):
    name = "mup"
    description = "muP (Tensor Programs V): hidden lr / fan-in under AdamW, readout multiplier 1/m"
    pre_norm_multiplier = True  # GDN-muP paper §4.3: keeps the recurrence output's size, and RMSNorm's eps share, fixed

    def rule(self, role: str, shape: Shape, m: float, optimizer: Optimizer) -> Rule:
        adam = optimizer == "adamw"
        if not shape.matrix:
            return Rule(init_scale=None, lr=1.0 if adam else shape.m_out)
        if role == "readout":
            return Rule(init_scale=1.0, lr=1.0 if adam else shape.m_in)
        if role == "embedding" or not shape.grows_in:
            return Rule(init_scale=1.0, lr=1.0 if adam else shape.m_out)
        return Rule(init_scale=1 / math.sqrt(shape.m_in), lr=1 / shape.m_in if adam else 1.0)

    pre_norm_multiplier = True

    def logit_multiplier(self, m: float) -> float:
        return 1 / m
