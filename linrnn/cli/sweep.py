"""``linrnn sweep [--cells ...] [--widths ...] [--adamw-lrs ...] [--table FILE] [--out DIR] [--workers N]``: the
learning-rate transfer sweep of ``linrnn.training.sweep``, resumable, then its report."""

from __future__ import annotations

import argparse
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from linrnn.cli.arguments import (
    cell_name,
    float_in,
    learning_rates,
    parametrization_name,
    positive_float,
    positive_int,
)
from linrnn.errors import UsageError, one_line
from linrnn.training.sweep import Run, SweepConfig, model_spec, pending, read_table, run_sweep, write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = SweepConfig()
    grid = parser.add_argument_group("grid")
    grid.add_argument("--cells", nargs="+", type=cell_name, default=["gdn"], help="cell names or aliases (default gdn)")
    grid.add_argument("--optimizers", nargs="+", choices=("adamw", "sgd"), default=defaults.optimizers)
    grid.add_argument("--params", nargs="+", type=parametrization_name, default=defaults.parametrizations,
                      help="sp mup gdn-mup (default all)")  # fmt: skip
    grid.add_argument("--widths", nargs="+", type=positive_int, default=defaults.widths)
    grid.add_argument("--base-width", type=positive_int, help="default: the smallest width")
    for name, lrs in defaults.lrs.items():
        default = f"{lrs[0]:g}:{lrs[-1]:g}:{len(lrs)}"
        grid.add_argument(f"--{name}-lrs", nargs="+", type=learning_rates, default=[lrs],
                          help=f"learning rates, or LOW:HIGH:COUNT log-spaced (default {default})")  # fmt: skip
    runs = parser.add_argument_group("each run")
    runs.add_argument("--layers", type=positive_int, default=defaults.num_layers)
    runs.add_argument("--heads", type=positive_int, default=defaults.num_heads)
    runs.add_argument("--seq-len", type=positive_int, default=defaults.seq_len)
    runs.add_argument("--batch-size", type=positive_int, default=defaults.batch_size)
    runs.add_argument("--steps", type=positive_int, default=defaults.steps)
    runs.add_argument("--warmup", type=float, default=defaults.warmup_fraction, help="warmup fraction of the steps")
    runs.add_argument("--min-lr-factor", type=float_in(0, 1), default=defaults.min_lr_factor)
    runs.add_argument("--max-norm", type=positive_float, default=defaults.max_norm, help="gradient clipping threshold")
    runs.add_argument("--momentum", type=float, default=defaults.momentum, help="SGD's Nesterov momentum")
    runs.add_argument("--readout-bias", action="store_true", help="a learned logit bias (outside the multiplier)")
    runs.add_argument("--heads-grow", action="store_true",
                      help="--heads at the base width, growing with width (fixed head dimensions)")  # fmt: skip
    runs.add_argument("--validation-batches", type=positive_int, help="default: the whole held-out set")
    runs.add_argument("--seed", type=int, default=defaults.seed)
    where = parser.add_argument_group("where")
    where.add_argument("--table", type=Path, default=Path("sweeps/sweep.jsonl"), help="results, one JSON row per run")
    where.add_argument("--out", type=Path, help="report and plots (default: the table's folder)")
    where.add_argument("--workers", type=positive_int, default=1,
                       help="processes training at once (they share the device)")  # fmt: skip
    where.add_argument("--time-limit", type=float, help="seconds after which no new run starts (resume later)")
    where.add_argument("--device", help="cuda or cpu (default: cuda when there is one)")
    where.add_argument("--report-only", action="store_true", help="write the report of the table, train nothing")


def config_from_args(args: argparse.Namespace) -> SweepConfig:
    flat = lambda lists: sorted({lr for group in lists for lr in group})  # noqa: E731
    return SweepConfig(
        cells=args.cells,
        optimizers=args.optimizers,
        parametrizations=args.params,
        widths=args.widths,
        base_width=args.base_width,
        lrs={"adamw": flat(args.adamw_lrs), "sgd": flat(args.sgd_lrs)},
        num_layers=args.layers,
        num_heads=args.heads,
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup_fraction=args.warmup,
        min_lr_factor=args.min_lr_factor,
        max_norm=args.max_norm,
        momentum=args.momentum,
        readout_bias=args.readout_bias,
        heads_grow=args.heads_grow,
        validation_batches=args.validation_batches,
        seed=args.seed,
    )


def run(args: argparse.Namespace) -> int:
    console = Console()
    table_widths = {row.get("width") for row in read_table(args.table)}
    if len(set(args.widths) | table_widths) < 2:  # one width here may add points to a table of others
        raise UsageError(f"argument --widths: a learning-rate transfer sweep compares the best learning rate across "
                         f"widths, expected at least two widths here and in {args.table}, got "
                         f"{args.widths}")  # fmt: skip
    try:
        config = config_from_args(args)
    except ValidationError as error:  # what the argparse types leave: the grid as a whole (base width, lrs, ...)
        raise UsageError(f"invalid sweep arguments: {one_line(error)}") from error
    if not args.report_only:
        todo = pending(config, args.table)
        # the base width is worth seeing: with one width it is that width, and every parametrization there is SP
        console.print(f"{len(config.runs())} grid points, {len(todo)} runs to train ({config.tokens_per_run:,} "
                      f"tokens each, base width {config.base}) → {args.table}")  # fmt: skip
        if todo:
            console.print(estimate_line(config, list(todo), args.table, args.device), highlight=False)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=console) as progress:
            task = progress.add_task("training", total=len(todo))

            def on_result(row: dict, done: int, total: int) -> None:
                result = "diverged" if row["diverged"] else f"val loss {row['val_loss']:.3f}"
                progress.console.print(f"{Run(**{k: row[k] for k in Run.model_fields}).label()}: {result} "
                                       f"({row['seconds']:.0f} s, {row['tokens_per_second']:,} tok/s)")  # fmt: skip
                progress.update(task, completed=done)

            run_sweep(config, args.table, workers=args.workers, time_limit=args.time_limit, device=args.device,
                      on_result=on_result, todo=todo)  # fmt: skip
    return write_report(config, args.table, args.out or args.table.parent, console)


def estimate_line(config: SweepConfig, todo: list[Run], table: Path, device: str | None) -> str:
    """How long the runs to train should take: each run's tokens at its width's rate, measured by the runs of these
    settings already in the table on this kind of device, else estimated (``linrnn.training.job.estimate``)."""
    import statistics

    import torch

    from linrnn.training import job

    kind = "cuda" if (device or ("cuda" if torch.cuda.is_available() else "cpu")).startswith("cuda") else "cpu"
    settings = config.settings_hash()
    measured: dict[tuple[str, int], list[float]] = {}
    for row in read_table(table):
        if row["key"].endswith(f"/{settings}") and (row.get("device") == "cpu") == (kind == "cpu"):
            measured.setdefault((row["cell"], row["width"]), []).append(row["tokens_per_second"])
    seconds, bases = 0.0, set()
    for run in todo:
        if (run.cell, run.width) in measured:
            seconds += config.tokens_per_run / statistics.median(measured[run.cell, run.width])
            bases.add("the table's runs on this device")
            continue
        model = model_spec(config, run).model_config()  # the model the sweep trains at this width
        guess = job.estimate(model, config.tokens_per_run, kind, config.seq_len)
        seconds += guess.seconds
        bases.add(guess.basis)
    rates = "; ".join(sorted(bases))
    return (f"estimate: {len(todo)} runs ≈ {job.duration(seconds)} of training in one process, plus validation "
            f"(rates: {rates}); --time-limit stops starting runs, the same command resumes")  # fmt: skip
