"""GDN-muP (the GDN-muP paper; docs/design.md, "Sources"): muP, except for the gates under SGD.

Under AdamW the paper's table is muP's with the gate matrices as hidden weights and the gate scalars width-
independent (its Appendix B: Adam's update is O(η) per coordinate whatever the gradient's size, so only fan-in
counts). Under SGD the gradients' sizes matter (its §5.4):

- gate matrices (W_α, W_β, and the low-rank gate factors whose fan-in grows): lr η · m_in^(−1/2),
- gate scalars (A_log, dt_bias): lr η · m^(1/2), per head or per channel alike,
- log Γ (GammaNet) is treated as a gate scalar: an extrapolation of the paper, which does not cover Γ.

The paper's §4.3 multiplier √d_k before the output RMSNorm is an option of ``apply``
(``pre_norm_multiplier=True``); it cancels inside RMSNorm up to its eps (docs/parametrizations.md).
"""

from __future__ import annotations

import math

from linrnn.parametrizations.base import Optimizer, Rule, Shape
from linrnn.parametrizations.mup import MuP


class GdnMuP(MuP):
    name = "gdn-mup"
    description = "GDN-muP paper: muP with SGD gate matrices at lr · m^-1/2 and gate scalars at lr · m^1/2"

    def rule(self, role: str, shape: Shape, m: float, optimizer: Optimizer) -> Rule:
        rule = super().rule(role, shape, m, optimizer)
        if optimizer == "sgd" and role == "gate" and shape.matrix and shape.grows_in:
            return Rule(init_scale=rule.init_scale, lr=shape.m_in**-0.5)
        if optimizer == "sgd" and role in ("gate_scalar", "gamma"):
            return Rule(init_scale=rule.init_scale, lr=math.sqrt(m))
        return rule
