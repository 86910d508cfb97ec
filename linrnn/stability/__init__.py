"""Stability of every cell's state transition: spectral radius, operator norms, long-horizon growth.

::

    from linrnn import stability
    A = stability.transition("kda", decay=alpha, beta=0.7, erase=k)   # [..., K, K], one step
    report = stability.check("gammanet", gamma_cond=1e3)                # random + adversarial search
    report.max_spectral_radius, report.max_norm, report.max_growth, report.bound, report.passed, report.worst
    stability.check_model(model, input_ids)                             # a model's actual gates, per layer

``transition.py`` has the operators and each cell's certificate, ``measures.py`` the measures, ``check.py`` the
random draws and the adversarial search, ``model.py`` the hooks on a model's mixers. ``seed_example()`` is the
KDA-F counterexample of Lucas Sun's GammaNet note (docs/design.md, "Sources").
"""

from __future__ import annotations

import torch

from linrnn.stability.check import StabilityReport, adversarial_inputs, check, measure, random_inputs
from linrnn.stability.measures import (
    log_growth,
    lyapunov_exponents,
    natural_norm,
    operator_norm,
    spectral_radius,
)
from linrnn.stability.model import LayerReport, check_model, model_inputs
from linrnn.stability.transition import (
    cell_certificate,
    certificate_metric,
    natural_metric,
    needed_inputs,
    stability_cells,
    transition,
)


def seed_example() -> dict[str, torch.Tensor]:
    """The GammaNet note's KDA-F counterexample (K = 2), as ``transition("kda_f", **seed_example())`` arguments:
    F = [[1, 2], [0, 1]], γ = (0.2, 0.8), β = 0.8, κ = (−1, 1)/√2; its spectral radius is ≈ 1.0495."""
    double = dict(dtype=torch.float64)
    return {
        "decay": torch.tensor([0.2, 0.8], **double),
        "beta": torch.tensor(0.8, **double),
        "erase": torch.tensor([-1.0, 1.0], **double) / 2**0.5,
        "F": torch.tensor([[1.0, 2.0], [0.0, 1.0]], **double),
    }


__all__ = [
    "cell_certificate",
    "needed_inputs",
    "LayerReport",
    "StabilityReport",
    "adversarial_inputs",
    "certificate_metric",
    "check",
    "check_model",
    "log_growth",
    "lyapunov_exponents",
    "measure",
    "model_inputs",
    "natural_metric",
    "natural_norm",
    "operator_norm",
    "random_inputs",
    "seed_example",
    "spectral_radius",
    "stability_cells",
    "transition",
]
