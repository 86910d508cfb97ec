"""Kimi Delta Attention: ``S_t = (I − β_t k_t k_tᵀ) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ``, g per key channel.

The decay gate is GDN's with a low-rank W_α producing one pre-activation per key channel:
``g = −exp(A_log_h) · softplus(W_α2 W_α1 x + dt_bias)``; A_log per head, dt_bias per channel.
"""

from __future__ import annotations

from einops import rearrange
from torch import nn

from linrnn.kernels import ops
from linrnn.kernels.fused import mamba_gates
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig, mamba_decay_params
from linrnn.recurrences.registry import CellSpec, register_cell


class KimiDeltaAttention(LinearRNNMixer):
    gate_inputs = ("f", "b")

    def __init__(self, config: MixerConfig):
        super().__init__(config)
        heads, key_width = config.num_heads, config.num_heads * config.head_k_dim
        rank = config.gate_low_rank or config.head_v_dim
        self.f_proj = nn.Sequential(
            nn.Linear(config.hidden_size, rank, bias=False), nn.Linear(rank, key_width, bias=False)
        )  # low-rank W_α
        self.b_proj = nn.Linear(config.hidden_size, heads, bias=False)  # W_β
        self.A_log, self.dt_bias = mamba_decay_params(heads, key_width)

    def gates(self, projected, k, extra):
        pre = rearrange(projected["f"], "b t (h k) -> b t h k", h=self.num_heads)
        dt_bias = rearrange(self.dt_bias, "(h k) -> h k", h=self.num_heads)
        g, beta = mamba_gates(pre, self.A_log[:, None], dt_bias, projected["b"], self.beta_scale, self.config.backend)
        return {"g": g, "beta": beta}


CHANNEL_GATE_ROLES = {
    "f_proj.0.weight": "gate",
    "f_proj.1.weight": "gate",
    "b_proj.weight": "gate",
    "A_log": "gate_scalar",
    "dt_bias": "gate_scalar",
}

SPEC = register_cell(
    CellSpec(
        name="kda",
        mixer=KimiDeltaAttention,
        structure=ops.KDA,
        description="Kimi Delta Attention: the delta rule with a decay per key channel",
        fla="kda",
        cell_roles=CHANNEL_GATE_ROLES,
    )
)
