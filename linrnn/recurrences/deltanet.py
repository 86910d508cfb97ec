"""DeltaNet: ``S_t = (I − β_t k_t k_tᵀ) S_{t−1} + β_t k_t v_tᵀ`` — delta rule, no decay."""

from __future__ import annotations

from torch import nn

from linrnn.kernels import ops
from linrnn.recurrences.base import LinearRNNMixer, MixerConfig
from linrnn.recurrences.registry import CellSpec, register_cell


class DeltaNet(LinearRNNMixer):
    gate_inputs = ("b",)

    def __init__(self, config: MixerConfig):
        super().__init__(config)
        self.b_proj = nn.Linear(config.hidden_size, config.num_heads, bias=False)  # W_β

    def gates(self, projected, k, extra):
        return {"beta": self.write_strength(projected["b"])}


SPEC = register_cell(
    CellSpec(
        name="deltanet",
        mixer=DeltaNet,
        structure=ops.DELTA_RULE,
        description="DeltaNet: the delta rule, no decay",
        fla="delta_net",
        cell_roles={"b_proj.weight": "gate"},
    )
)
