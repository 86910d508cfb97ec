"""GammaNet (Lucas Sun's GammaNet note; docs/design.md, "Sources"): KDA with a decoupled, Γ-conjugated erase direction.

``S_t = (I − β_t Γ a_t a_tᵀ Γ⁻¹) Diag(exp g_t) S_{t−1} + β_t k_t v_tᵀ`` (FLA orientation),
``a_t = normalize(W_a x_t)`` with its own short conv, Γ = Diag(exp log_gamma) per head
(``log_gamma`` ``[H, K]``, initialised to 0). The transition ``Γ (I − β a aᵀ) Diag(γ) Γ⁻¹`` is
similar to a non-expansive matrix: spectral radius ≤ 1 and ``‖∏ A_t‖₂ ≤ cond(Γ)``.

With W_a free, Γ could fold into W_k and W_q; what GammaNet adds over KDA in function
class is the decoupled erase direction. Γ matters for optimisation and for the certificate.
"""

from __future__ import annotations

import torch
from torch import nn

from linrnn.kernels import ops
from linrnn.recurrences.kda import CHANNEL_GATE_ROLES, KimiDeltaAttention
from linrnn.recurrences.registry import CellSpec, register_cell


class GammaNet(KimiDeltaAttention):
    extra_key_streams = ("a",)

    def __init__(self, config):
        super().__init__(config)
        self.log_gamma = nn.Parameter(torch.zeros(config.num_heads, config.head_k_dim))

    def gates(self, projected, k, extra):
        return {"a": extra["a"], **super().gates(projected, k, extra), "log_gamma": self.log_gamma}


SPEC = register_cell(
    CellSpec(
        name="gammanet",
        mixer=GammaNet,
        structure=ops.GAMMANET,
        description="GammaNet: KDA with a decoupled, Γ-conjugated erase direction",
        cell_roles={**CHANNEL_GATE_ROLES, "a_proj.weight": "hidden", "a_conv.weight": "hidden", "log_gamma": "gamma"},
    )
)
