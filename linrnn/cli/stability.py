"""``linrnn stability``: ``check`` per cell (or ``check_model`` per layer of a saved model on the demo text), its
table (``linrnn.stability.report``) and the growth plot."""

from __future__ import annotations

import argparse
import math
import time

from rich.console import Console
from rich.progress import Progress

from linrnn.cli.arguments import existing_file, float_in, nonnegative_int, plot_file, positive_int, stability_cell
from linrnn.errors import UsageError
from linrnn.models import load_checkpoint
from linrnn.stability import report
from linrnn.stability.check import check
from linrnn.stability.model import check_model
from linrnn.stability.transition import stability_cells
from linrnn.text import text_bytes


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cells", nargs="*", type=stability_cell, default=["all"],
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


def run(args: argparse.Namespace) -> int:
    console = Console(width=max(Console().width, report.TABLE_WIDTH))
    if args.checkpoint is not None:
        return run_checkpoint(args, console)
    if "all" in args.cells and len(args.cells) > 1:
        raise UsageError(f"argument cells: expected 'all' alone or cell names, got {args.cells}")
    if args.draws == 0 and not (args.restarts and args.steps):
        raise UsageError("argument --draws: expected random draws or a search, got --draws 0 and no search "
                         f"(--restarts {args.restarts}, --steps {args.steps})")  # fmt: skip
    names = stability_cells() if args.cells == ["all"] else list(dict.fromkeys(args.cells))
    reports = []
    search = f" and a search of {args.restarts} starts × {args.steps} steps" if args.restarts and args.steps else ""
    console.print(f"checking {len(names)} cell{'s' * (len(names) > 1)}: {args.draws:,} random steps{search} each "
                  f"(with the defaults, seconds to 3 min a cell on 2 CPU cores)", soft_wrap=True)  # fmt: skip
    with Progress(console=console, transient=True) as progress:
        for number, name in enumerate(names, 1):
            batches = math.ceil(math.ceil(args.draws / args.horizon) / 256)  # check() measures 256 sequences at once
            steps = args.steps if args.restarts else 0
            task = progress.add_task(f"{name}: random draws + search", total=batches + steps)
            started = time.perf_counter()
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
            progress.remove_task(task)
            # a line per cell stays, on a terminal or not (the bar shows on a terminal only)
            line = f"[{number}/{len(names)}] {name}: {reports[-1].verdict} ({time.perf_counter() - started:.0f} s)"
            progress.console.print(line, highlight=False, markup=False, soft_wrap=True)
    console.print(report.cell_table(reports, key_dim=args.dim, draws=args.draws, horizon=args.horizon,
                                    beta_max=args.beta_max, gamma_cond=args.gamma_cond, basis=args.basis))  # fmt: skip
    for cell_report in reports:
        console.print(f"[bold]{cell_report.cell}[/] worst inputs: {report.worst_text(cell_report)}")
    if "kda_f" in names:
        console.print(report.seed_example_text())
    if args.plot is not None:
        report.plot_growth(reports, args.plot)
        console.print(f"plot: {args.plot}")
    failed = [cell_report.cell for cell_report in reports if not cell_report.passed and cell_report.cell != "kda_f"]
    if failed:
        console.print(f"[red]certificate violated: {', '.join(failed)}")
    return 1 if failed else 0


def run_checkpoint(args: argparse.Namespace, console: Console) -> int:
    """``--checkpoint``: each layer's actual gates on the demo's training windows."""
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
    console.print(report.layer_table(reports, f"{args.checkpoint} on the demo text ({windows.shape[0]} × 64 bytes)"))
    return 0 if all(layer.passed for layer in reports) else 1
