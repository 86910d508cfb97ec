"""What ``linrnn stability`` shows: the table of ``check`` per cell (or of ``check_model`` per layer), the worst
inputs, the GammaNet note's KDA-F example (``seed_example``) and the growth plot."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from rich.table import Table

from linrnn.stability.check import TOLERANCE, StabilityReport
from linrnn.stability.measures import log_growth, spectral_radius
from linrnn.stability.model import LayerReport
from linrnn.stability.transition import transition

LN10 = math.log(10)
TABLE_WIDTH = 170  # the tables wrap into unreadable columns at a pipe's default width of 80
PLOT_STEPS = 200  # horizon of the plot's repeated worst step and of the KDA-F example's growth


def cell_table(reports: list[StabilityReport], *, key_dim: int, draws: int, horizon: int, beta_max: float,
               gamma_cond: float, basis: str) -> Table:  # fmt: skip
    """A row per cell's report of ``check`` run with these settings (``basis``: kda_f's F)."""
    table = Table(title=f"transition stability: K = {key_dim}, {draws} random steps, search "
                        f"{reports[0].search if reports else '-'}, beta in [0, {beta_max:g}], "
                        f"cond(Γ) ≤ {gamma_cond:g}")  # fmt: skip
    for column in ("cell", "max ρ", "max ‖A‖₂", "max natural norm", f"max growth (T ≤ {horizon})",
                   "growth / bound", "bound", "verdict"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("cell", "bound", "verdict") else "right")
    for r in reports:
        label = f"{r.cell} ({basis} F)" if r.cell == "kda_f" else r.cell
        style = "green" if r.passed else "red"
        table.add_row(label, _num(r.max_spectral_radius), _num(r.max_norm), _num(r.max_natural_norm),
                      _num(r.max_growth), _num(r.max_growth_ratio), r.bound, f"[{style}]{r.verdict}")  # fmt: skip
    return table


def _num(value: float) -> str:
    """Six decimals near 1 (where the bounds are), else four significant digits."""
    return f"{value:.6f}" if abs(value) < 100 else f"{value:.4g}"


def worst_text(report: StabilityReport) -> str:
    """The step behind the largest spectral radius when it exceeds 1, else behind the largest certificate norm."""
    if report.max_spectral_radius > 1 + TOLERANCE:
        key, text = "spectral_radius", f"ρ = {report.max_spectral_radius:.6g}"
    else:
        key, text = "certificate_norm", f"norm in the certificate's metric = {report.max_certificate_norm:.12g}"
    parts = [f"{arg}={_short(x)}" for arg, x in report.worst[key].items()]
    return f"{text} at " + ", ".join(parts)


def _short(x: torch.Tensor) -> str:
    values = x.flatten().tolist()
    text = ", ".join(f"{value:.3g}" for value in values[:8]) + (", …" if len(values) > 8 else "")
    return text if x.dim() == 0 else f"[{text}]"


def seed_example_text() -> str:
    from linrnn.stability import seed_example

    A = transition("kda_f", **seed_example())
    growth = log_growth(A.expand(PLOT_STEPS, 2, 2)).exp()
    return (f"the GammaNet note's KDA-F example (F = [[1, 2], [0, 1]], γ = (0.2, 0.8), β = 0.8, κ = (−1, 1)/√2): "
            f"ρ = {float(spectral_radius(A)):.4f}, ‖A^{PLOT_STEPS}‖₂ = {float(growth[-1]):.4g} — unstable")  # fmt: skip


def plot_growth(reports: list[StabilityReport], path: Path) -> None:
    """Left: ‖A_t ⋯ A_1‖₂ of each cell's sequence with the largest growth at the horizon; right: ‖A^t‖₂ of its
    largest-ρ step repeated (and the GammaNet note's KDA-F example)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from linrnn.stability import seed_example

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for report in reports:
        label = report.cell
        sequence = {arg: x[None] for arg, x in report.worst["final_log_growth"].items()}  # [1, T, ...]
        left.plot(range(1, report.horizon + 1), log_growth(transition(report.cell, **sequence))[0] / LN10, label=label)
        step = report.worst["spectral_radius"]
        A = transition(report.cell, **step)
        right.plot(range(1, PLOT_STEPS + 1), log_growth(A.expand(PLOT_STEPS, *A.shape)) / LN10,
                   label=f"{label} (ρ = {float(spectral_radius(A)):.4g})")  # fmt: skip
    A = transition("kda_f", **seed_example())
    right.plot(range(1, PLOT_STEPS + 1), log_growth(A.expand(PLOT_STEPS, 2, 2)) / LN10, "k--",
               label="GammaNet note's KDA-F example (ρ ≈ 1.0495)")  # fmt: skip
    for axis, title in ((left, "largest growth at T = horizon: log10 ‖A_T ⋯ A_1‖₂"),
                        (right, "largest-ρ step repeated: log10 ‖A^T‖₂")):  # fmt: skip
        axis.set_xlabel("T (steps)")
        axis.set_ylim(-3, 6)  # unstable curves leave the top; decaying ones the bottom
        axis.set_title(title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def layer_table(reports: list[LayerReport], title: str) -> Table:
    table = Table(title=title)
    for column in ("layer", "cell", "max ρ", "max ‖A‖₂", "max natural norm", "max growth", "growth / bound",
                   "mean decay", "mean β", "bound", "verdict"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("cell", "bound", "verdict") else "right")
    for r in reports:
        beta = "-" if r.mean_beta is None else f"{r.mean_beta:.3f}"
        verdict = "[green]certificate holds" if r.passed else "[red]violated"
        table.add_row(str(r.layer), r.cell, _num(r.max_spectral_radius), _num(r.max_norm),
                      _num(r.max_natural_norm), _num(r.max_growth), _num(r.max_growth_ratio),
                      f"{r.mean_decay:.3f}", beta, r.bound, verdict)  # fmt: skip
    return table
