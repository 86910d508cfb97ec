"""Gated DeltaNet-2: KDA with channel-wise erase and write gates (FLA's ``gdn2``)::

    S_t = (I − k_t (b_t ⊙ k_t)ᵀ) Diag(exp g_t) S_{t−1} + k_t (w_t ⊙ v_t)ᵀ

``b = sigmoid(W_b x)`` per key channel (times 2 with ``allow_neg_eigval``), ``w = sigmoid(W_w x)`` per value
channel, and KDA's decay ``g = −exp(A_log_h) · softplus(W_α2 W_α1 x + dt_bias)``. With b = w = β it is KDA. The
erase reads the state along ``b ⊙ k`` and writes along k, so ``I − k (b ⊙ k)ᵀ`` is not symmetric: its
certificate is ρ ≤ 1 per step only (``linrnn.stability.transition``).
"""

from __future__ import annotations

from einops import rearrange
from torch import nn

from linrnn.kernels import ops
from linrnn.kernels.fused import mamba_log_decay
from linrnn.recurrences.base import MixerConfig, at_least_fp32
from linrnn.recurrences.kda import CHANNEL_GATE_ROLES, KimiDeltaAttention
from linrnn.recurrences.registry import CellSpec, register_cell


class GatedDeltaNet2(KimiDeltaAttention):
    gate_inputs = ("f", "b", "w")

    def __init__(self, config: MixerConfig):
        super().__init__(config)
        key_width, value_width = config.num_heads * config.head_k_dim, config.num_heads * config.head_v_dim
        self.b_proj = nn.Linear(config.hidden_size, key_width, bias=False)  # W_b: erase gate per key channel
        self.w_proj = nn.Linear(config.hidden_size, value_width, bias=False)  # W_w: write gate per value channel

    def gates(self, projected, k, extra):
        heads = self.num_heads
        pre = rearrange(projected["f"], "b t (h k) -> b t h k", h=heads)
        dt_bias = rearrange(self.dt_bias, "(h k) -> h k", h=heads)
        g = mamba_log_decay(pre, self.A_log[:, None], dt_bias, self.config.backend)  # KDA's decay
        b = self.beta_scale * at_least_fp32(rearrange(projected["b"], "b t (h k) -> b t h k", h=heads)).sigmoid()
        w = at_least_fp32(rearrange(projected["w"], "b t (h v) -> b t h v", h=heads)).sigmoid()
        return {"g": g, "b": b, "w": w}


SPEC = register_cell(
    CellSpec(
        name="gdn2",
        mixer=GatedDeltaNet2,
        structure=ops.GDN2,
        description="Gated DeltaNet-2: KDA with channel-wise erase and write gates",
        cell_roles={**CHANNEL_GATE_ROLES, "w_proj.weight": "gate"},
        fla="gdn2",
    )
)
