"""Gated linear attention: ``S_t = Diag(exp g_t) S_{t−1} + k_t v_tᵀ``, ``g = logsigmoid(W_α2 W_α1 x + b) / 16``."""

from __future__ import annotations

import torch.nn.functional as F
from einops import rearrange
from torch import nn

from linrnn.kernels import ops
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig, at_least_fp32
from linrnn.recurrences.registry import CellSpec, register_cell

GATE_NORMALIZER = 16  # GLA's logsigmoid(·)/16 keeps the decay close to 1 at init


class GatedLinearAttention(LinearRNNMixer):
    gate_inputs = ("f",)

    def __init__(self, config: MixerConfig):
        super().__init__(config)
        key_width = config.num_heads * config.head_k_dim
        self.f_proj = nn.Sequential(
            nn.Linear(config.hidden_size, config.gate_low_rank, bias=False),
            nn.Linear(config.gate_low_rank, key_width, bias=True),
        )  # low-rank W_α with bias

    def gates(self, projected, k, extra):
        pre = at_least_fp32(rearrange(projected["f"], "b t (h k) -> b t h k", h=self.num_heads))
        return {"g": F.logsigmoid(pre) / GATE_NORMALIZER}


SPEC = register_cell(
    CellSpec(
        name="gla",
        mixer=GatedLinearAttention,
        structure=ops.GLA,
        description="Gated linear attention: per-channel decay, no erase",
        fla="gla",
        cell_roles={"f_proj.0.weight": "gate", "f_proj.1.weight": "gate", "f_proj.1.bias": "bias"},
        defaults={"gate_low_rank": 16},
    )
)
