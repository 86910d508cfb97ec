"""``linrnn coord-check CELL --param NAME --optimizer adamw|sgd [--lr LR] [--widths ...] [--plot FILE]``: the
coordinate check (``linrnn.parametrizations.coord_check``) as a table of slopes per step, and its plot."""

from __future__ import annotations

import argparse

import numpy as np
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from linrnn.cli.arguments import (
    cell_name,
    nonnegative_int,
    parametrization_name,
    plot_file,
    positive_float,
    positive_int,
)
from linrnn.errors import UsageError, one_line
from linrnn.parametrizations.coord_check import coord_check


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("cell", type=cell_name, help="cell name or alias")
    parser.add_argument("--param", type=parametrization_name, default="gdn-mup",
                        help="parametrization: sp, mup, gdn-mup (default gdn-mup)")  # fmt: skip
    parser.add_argument("--optimizer", choices=("adamw", "sgd"), default="adamw")
    parser.add_argument("--lr", type=positive_float, help="base learning rate (default 1e-3 for AdamW, 0.1 for SGD)")
    parser.add_argument("--widths", type=positive_int, nargs="+", default=[64, 128, 256, 512],
                        help="at least two distinct widths (default 64 128 256 512)")  # fmt: skip
    parser.add_argument("--base-width", type=positive_int, default=64)
    parser.add_argument("--steps", type=nonnegative_int, default=3, help="training steps (default 3)")
    parser.add_argument("--seeds", type=positive_int, default=6,
                        help="average the sizes over this many inits (default 6)")  # fmt: skip
    parser.add_argument("--random-readout", action="store_true", help="σ-initialised readout instead of zero")
    parser.add_argument("--no-pre-norm-multiplier", action="store_true", help="switch the GDN-muP §4.3 multiplier off")
    parser.add_argument("--plot", type=plot_file, help="write the size-against-width plot here (png, pdf, svg)")


def check_arguments(args: argparse.Namespace) -> None:
    """Before any training: at least two widths, and a mixer at every width and at the base width."""
    from linrnn.recurrences.base import MixerConfig
    from linrnn.recurrences.registry import get_cell

    if len(set(args.widths)) < 2:
        raise UsageError(f"argument --widths: expected at least two distinct widths, got {args.widths}")
    for flag, width in [*(("--widths", width) for width in args.widths), ("--base-width", args.base_width)]:
        try:  # the mixer's head dimensions, as build_mixer checks them (no tensors)
            MixerConfig(hidden_size=width, num_heads=2, **get_cell(args.cell).defaults)
        except ValueError as error:
            raise UsageError(f"argument {flag}: expected a width that gives a {args.cell} model with 2 heads, got "
                             f"{width} ({one_line(error)})") from error  # fmt: skip


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    console = Console(width=max(Console().width, 130))
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("training", total=args.seeds * len(args.widths) * args.steps)
        check = coord_check(
            args.cell,
            args.param,
            widths=tuple(args.widths),
            base_width=args.base_width,
            optimizer=args.optimizer,
            lr=args.lr,
            steps=args.steps,
            seeds=range(args.seeds),
            pre_norm_multiplier=False if args.no_pre_norm_multiplier else None,
            readout_zero_init=not args.random_readout,
            on_step=lambda: progress.advance(task),
        )
    table = Table(
        title=f"coordinate check: {check.cell}, {check.parametrization}, {check.optimizer}, lr {check.lr:g}, "
        f"widths {check.widths}: slope of log mean |coordinate| against log width"
    )
    table.add_column("output")
    for t in range(check.steps + 1):
        table.add_column(f"step {t}" + (" (init)" if t == 0 else ""), justify="right")
    for name, slope in check.slopes().items():
        style = "red" if (np.abs(slope[~np.isnan(slope)]) > 0.15).any() else ""
        table.add_row(name, *("-" if np.isnan(v) else f"[{style}]{v:+.2f}" if style else f"{v:+.2f}" for v in slope))
    console.print(table)
    name, step, slope = check.worst_slope()
    console.print(f"largest |slope| of a size: {name} at step {step}: {slope:+.2f}")
    if args.plot:
        check.plot(args.plot)
        console.print(f"plot: {args.plot}")
    return 0
