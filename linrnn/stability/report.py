"""``linrnn stability``: the table of ``check`` per cell (or of ``check_model`` per layer) and the growth plot."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from linrnn.errors import UsageError
from linrnn.stability.check import TOLERANCE, StabilityReport, check
from linrnn.stability.measures import log_growth, spectral_radius
from linrnn.stability.model import LayerReport, check_model
from linrnn.stability.transition import stability_cell, stability_cells, transition
from linrnn.text import text_bytes

LN10 = math.log(10)
TABLE_WIDTH = 170  # the tables wrap into unreadable columns at a pipe's default width of 80
PLOT_STEPS = 200  # horizon of the plot's repeated worst step and of the seed example's growth


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from linrnn.cli import existing_file, float_in, nonnegative_int, plot_file, positive_int

    parser.add_argument("cells", nargs="*", type=_cell, default=["all"],
                        help="cells to check, or 'all' (default), or kda_f")  # fmt: skip
    parser.add_argument("--checkpoint", type=existing_file,
                        help="check a saved model's actual gates on the demo text instead")  # fmt: skip
    parser.add_argument("--plot", type=plot_file, help="write a plot of growth against T per cell (png, pdf, svg)")
    parser.add_argument("--dim", type=positive_int, default=8, help="key dimension K of the random and searched steps")
    parser.add_argument("--draws", type=nonnegative_int, default=10_000, help="random steps per cell (default 10000)")
    parser.add_argument("--horizon", type=positive_int, default=32, help="steps per sequence for growth (default 32)")
    parser.add_argument("--restarts", type=nonnegative_int, default=48, help="adversarial search starts (default 48)")
    parser.add_argument("--steps", type=nonnegative_int, default=200, help="Adam steps per start (default 200)")
    parser.add_argument("--beta-max", type=float_in(0, 2), default=2.0, help="beta range [0, B], B ≤ 2 (default 2)")
    parser.add_argument("--gamma-cond", type=float_in(1), default=1e3, help="largest cond(Γ) drawn (default 1e3)")
    parser.add_argument("--basis", choices=("general", "orthogonal"), default="general",
                        help="kda_f's bases: Gaussian F or F with orthogonal columns (default general)")  # fmt: skip
    parser.add_argument("--seed", type=int, default=0)


def _cell(name: str) -> str:
    """The argparse type of a cell: a registered cell (canonical name), kda_f or all."""
    if name == "all":
        return name
    try:
        return stability_cell(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    console = Console(width=max(Console().width, TABLE_WIDTH))
    if args.checkpoint is not None:
        return _run_checkpoint(args, console)
    if "all" in args.cells and len(args.cells) > 1:
        raise UsageError(f"argument cells: expected 'all' alone or cell names, got {args.cells}")
    if args.draws == 0 and not (args.restarts and args.steps):
        raise UsageError("argument --draws: expected random draws or a search, got --draws 0 and no search "
                         f"(--restarts {args.restarts}, --steps {args.steps})")  # fmt: skip
    names = stability_cells() if args.cells == ["all"] else list(dict.fromkeys(args.cells))
    reports = []
    with Progress(console=console, transient=True) as progress:
        for name in names:
            batches = math.ceil(math.ceil(args.draws / args.horizon) / 256)  # check() measures 256 sequences at once
            steps = args.steps if args.restarts else 0
            task = progress.add_task(f"{name}: random draws + search", total=batches + steps)
            reports.append(
                check(
                    name,
                    key_dim=args.dim,
                    draws=args.draws,
                    horizon=args.horizon,
                    restarts=args.restarts,
                    steps=args.steps,
                    beta_max=args.beta_max,
                    gamma_cond=args.gamma_cond,
                    F=args.basis,
                    seed=args.seed,
                    on_step=lambda task=task: progress.advance(task),
                )  # fmt: skip
            )
    console.print(cell_table(reports, args))
    for report in reports:
        console.print(f"[bold]{report.cell}[/] worst inputs: {worst_text(report)}")
    if "kda_f" in names:
        console.print(seed_example_text())
    if args.plot is not None:
        plot_growth(reports, args.plot)
        console.print(f"plot: {args.plot}")
    failed = [report.cell for report in reports if not report.passed and report.cell != "kda_f"]
    if failed:
        console.print(f"[red]certificate violated: {', '.join(failed)}")
    return 1 if failed else 0


def cell_table(reports: list[StabilityReport], args: argparse.Namespace) -> Table:
    table = Table(title=f"transition stability: K = {args.dim}, {args.draws} random steps, search "
                        f"{reports[0].search if reports else '-'}, beta in [0, {args.beta_max:g}], "
                        f"cond(Γ) ≤ {args.gamma_cond:g}")  # fmt: skip
    for column in ("cell", "max ρ", "max ‖A‖₂", "max natural norm", f"max growth (T ≤ {args.horizon})",
                   "growth / bound", "bound", "verdict"):  # fmt: skip
        table.add_column(column, justify="left" if column in ("cell", "bound", "verdict") else "right")
    for r in reports:
        label = f"{r.cell} ({args.basis} F)" if r.cell == "kda_f" else r.cell
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
    return (f"seed 003's KDA-F example (F = [[1, 2], [0, 1]], γ = (0.2, 0.8), β = 0.8, κ = (−1, 1)/√2): "
            f"ρ = {float(spectral_radius(A)):.4f}, ‖A^{PLOT_STEPS}‖₂ = {float(growth[-1]):.4g} — unstable")  # fmt: skip


def plot_growth(reports: list[StabilityReport], path: Path) -> None:
    """Left: ‖A_t ⋯ A_1‖₂ of each cell's sequence with the largest growth at the horizon; right: ‖A^t‖₂ of its
    largest-ρ step repeated (and seed 003's example)."""
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
               label="seed 003 KDA-F example (ρ ≈ 1.0495)")  # fmt: skip
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


def _run_checkpoint(args: argparse.Namespace, console: Console) -> int:
    from linrnn.models import load_checkpoint

    console.width = max(console.width, 170)
    try:
        model = load_checkpoint(args.checkpoint)
    except UsageError as error:
        raise UsageError(f"argument --checkpoint: {str(error).removeprefix('load_checkpoint: ')}") from error
    model.eval()
    data = text_bytes()
    if model.config.vocab_size < 256:
        raise UsageError(f"argument --checkpoint: the demo text is bytes and needs vocab_size ≥ 256, got "
                         f"{model.config.vocab_size} in {args.checkpoint}")  # fmt: skip
    windows = data[: (len(data) // 64) * 64].view(-1, 64)  # [B, 64]: the demo's training windows
    reports = check_model(model, windows)
    console.print(layer_table(reports, f"{args.checkpoint} on the demo text ({windows.shape[0]} × 64 bytes)"))
    return 0 if all(report.passed for report in reports) else 1


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
