"""The transitions a model actually runs: its mixers' gates on real input, captured with forward hooks.

``check_model(model, input_ids)`` runs the model once; a forward hook on every mixer recomputes what its
recurrence saw (``LinearRNNMixer.recurrence_inputs``: decay exp(g), beta, the erase direction, Γ) from the
mixer's input, and each (sequence, head) of each layer becomes one sequence of T transitions, measured exactly
(fp64) against the cell's certificate.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from einops import rearrange
from torch import Tensor, nn

from linrnn.recurrences.base import LinearRNNMixer
from linrnn.stability.check import measure, within_certificate
from linrnn.stability.transition import cell_certificate, needed_inputs


@dataclass
class LayerReport:
    layer: int
    cell: str
    max_spectral_radius: float
    max_norm: float
    max_natural_norm: float
    max_growth: float  # ‖A_t ⋯ A_1‖₂ over the batch's sequences and heads, t ≤ T
    max_growth_ratio: float  # growth / cond of the certificate's metric
    mean_decay: float
    mean_beta: float | None
    bound: str
    passed: bool


@torch.no_grad()
def model_inputs(model: nn.Module, input_ids: Tensor) -> list[tuple[str, dict[str, Tensor]]]:
    """Per mixer, in module order: (cell, inputs of ``transition`` as ``[B·H, T, ...]`` fp64 tensors)."""
    captured = []

    def hook(mixer: LinearRNNMixer, args, output):
        state = args[1] if len(args) > 1 else None
        captured.append((mixer.cell, mixer.recurrence_inputs(args[0], state)))

    mixers = [module for module in model.modules() if isinstance(module, LinearRNNMixer)]
    if not mixers:
        raise ValueError(f"check_model: argument 'model' has no linrnn mixer layers ({type(model).__name__})")
    handles = [mixer.register_forward_hook(hook) for mixer in mixers]
    try:
        model(input_ids)
    finally:
        for handle in handles:
            handle.remove()
    return [(cell, _as_sequences(cell, raw)) for cell, raw in captured]


def _as_sequences(cell: str, raw: dict[str, Tensor]) -> dict[str, Tensor]:
    """Mixer gates ``[B, T, H, ...]`` (log_gamma ``[H, K]``) → the inputs of ``cell``'s ``transition``
    ``[B·H, T, ...]`` in fp64 (gates that do not enter the transition, such as a write gate, are left out)."""
    needs = needed_inputs(cell)
    targets = {"g": "decay", "beta": "beta", "b": "erase_gate", "erase": "erase"}
    inputs = {}
    batch = next(x for x in raw.values() if x.dim() >= 3).shape[0]
    for name, x in raw.items():
        x = x.detach().to(torch.float64)
        if name == "log_gamma" and "gamma" in needs:
            inputs["gamma"] = rearrange(x.exp(), "h k -> h 1 k").repeat(batch, 1, 1)
        elif targets.get(name) in needs:
            inputs[targets[name]] = rearrange(x.exp() if name == "g" else x, "b t h ... -> (b h) t ...")
    if "erase" in inputs:  # the mixer's L2 norm x / sqrt(‖x‖² + 1e-6) is just below 1; measure the unit direction
        inputs["erase"] = torch.nn.functional.normalize(inputs["erase"], dim=-1)
    return inputs


def check_model(model: nn.Module, input_ids: Tensor) -> list[LayerReport]:
    """Per layer: the largest spectral radius, norms and growth of the transitions the model ran on
    ``input_ids`` ``[B, T]``, and whether the cell's certificate held."""
    reports = []
    for layer, (cell, inputs) in enumerate(model_inputs(model, input_ids)):
        m = measure(cell, inputs)
        growth = m.log_growth.amax(-1)
        ratio = (growth - m.log_bound).amax()
        reports.append(
            LayerReport(
                layer=layer,
                cell=cell,
                max_spectral_radius=float(m.spectral_radius.max()),
                max_norm=float(m.norm.max()),
                max_natural_norm=float(m.natural_norm.max()),
                max_growth=float(growth.max().exp()),
                max_growth_ratio=float(ratio.exp()),
                mean_decay=float(inputs["decay"].mean()) if "decay" in inputs else 1.0,
                mean_beta=float(inputs["beta"].mean()) if "beta" in inputs else None,
                bound=cell_certificate(cell).text,
                passed=within_certificate(
                    float(m.spectral_radius.max()), float(m.certificate_norm.max()), float(ratio.exp()),
                    cell_certificate(cell).metric,
                ),
            )
        )
    return reports
