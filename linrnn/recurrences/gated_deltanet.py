"""Gated DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) exp(g_t) S_{t−1} + β_t k_t v_tᵀ``, g per head (Yang, Kautz and
Hatamizadeh, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025, §3).

``g = −exp(A_log) · softplus(W_α x + dt_bias)`` (Mamba-2 style), ``β = sigmoid(W_β x)``.
"""

from __future__ import annotations

from torch import nn

from linrnn.kernels import ops
from linrnn.kernels.fused import MambaGateColumns, mamba_gates
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig, mamba_decay_params
from linrnn.recurrences.registry import CellSpec, register_cell


class GatedDeltaNet(LinearRNNMixer):
    gate_inputs = ("f", "b")

    def __init__(self, config: MixerConfig):
        super().__init__(config)
        heads = config.num_heads
        self.f_proj = nn.Linear(config.hidden_size, heads, bias=False)  # W_α
        self.b_proj = nn.Linear(config.hidden_size, heads, bias=False)  # W_β
        self.A_log, self.dt_bias = mamba_decay_params(heads, heads)

    def gate_columns(self, columns):
        (decay_start, _), (beta_start, heads) = columns["f"], columns["b"]
        return MambaGateColumns(decay_start, self.A_log, self.dt_bias, beta_start, heads, self.beta_scale)

    def gates(self, projected, k, extra):
        if "mamba_gates" in projected:  # decoding: from the projection's kernel
            return projected["mamba_gates"]
        g, beta = mamba_gates(projected["f"], self.A_log, self.dt_bias, projected["b"], self.beta_scale,
                              self.config.backend)  # fmt: skip
        return {"g": g, "beta": beta}  # [B, T, H] each


SPEC = register_cell(
    CellSpec(
        name="gated_deltanet",
        mixer=GatedDeltaNet,
        structure=ops.GATED_DELTA_RULE,
        description="Gated DeltaNet: the delta rule with a decay per head",
        fla="gated_deltanet",
        cell_roles={
            "f_proj.weight": "gate",
            "b_proj.weight": "gate",
            "A_log": "gate_scalar",
            "dt_bias": "gate_scalar",
        },
        aliases=("gdn",),
    )
)
