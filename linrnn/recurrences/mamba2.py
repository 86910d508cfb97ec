"""Mamba-2 (SSD) as a case of the one recurrence: a per-head scalar decay from a softplus step size, no erase::

    S_t = exp(Δ_t A_h) S_{t−1} + Δ_t B_t x_tᵀ,   y_t = S_tᵀ C_t + D_h x_t

with ``Δ = softplus(W_Δ x + dt_bias)``, ``A_h = −exp(A_log_h)``; in linrnn's names q = C, k = B, v = x (after the
short conv), g = Δ·A, β = Δ (the write strength; ``linrnn.ops.ssd``), query scale 1, q and k not normalised.
``D`` is a learned skip per head. The output goes through the shared gated RMSNorm (Mamba-2's ``z`` gate, SiLU)
and ``o_proj``. Each head has its own B and C (Mamba-2 with ``ngroups`` = heads).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from linrnn.kernels import ops
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig, at_least_fp32, mamba_decay_params
from linrnn.recurrences.registry import CellSpec, register_cell


class Mamba2(LinearRNNMixer):
    gate_inputs = ("dt",)
    normalize_keys = False
    scale = 1.0

    def __init__(self, config: MixerConfig):
        super().__init__(config)
        heads = config.num_heads
        self.dt_proj = nn.Linear(config.hidden_size, heads, bias=False)  # W_Δ
        self.A_log, self.dt_bias = mamba_decay_params(heads, heads)
        self.D = nn.Parameter(torch.ones(heads))

    def gates(self, projected, k, extra):
        step = F.softplus(at_least_fp32(projected["dt"]) + self.dt_bias)  # Δ [B, T, H]
        return {"g": -self.A_log.exp() * step, "beta": step}

    def combine(self, o, v):
        return o + (self.D[:, None] * v).to(o.dtype)  # [B, T, H, V]


SPEC = register_cell(
    CellSpec(
        name="mamba2",
        mixer=Mamba2,
        structure=ops.SSD,
        description="Mamba-2 (SSD): a per-head decay from a softplus step size, no erase, a skip D",
        cell_roles={"dt_proj.weight": "gate", "A_log": "gate_scalar", "dt_bias": "gate_scalar", "D": "gate_scalar"},
        fla="mamba2",
    )
)
