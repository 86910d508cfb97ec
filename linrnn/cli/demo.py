"""``linrnn demo``: train each cell's byte-tiny model briefly on a sonnet, check step-by-step decoding against the
full forward, and sample greedily."""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

import linrnn
from linrnn.cli.arguments import cell_name, positive_int
from linrnn.errors import UsageError
from linrnn.models import LanguageModel, save_checkpoint
from linrnn.text import TEXT, text_bytes
from linrnn.training.loop import train_steps

WINDOW = 64  # bytes per training sequence
BATCH = 8
LEARNING_RATE = 3e-3
PROMPT = "Shall I "
SAMPLE_BYTES = 40
DECODE_CHECK_BYTES = 80  # longer than every default chunk, so the check crosses chunk boundaries
DECODE_TOLERANCE = 1e-3  # max |logit difference| between step-by-step decoding and the full forward


@dataclass
class DemoResult:
    cell: str
    parameters: int
    losses: list[float]
    seconds: float
    decode_diff: float
    sample: str

    @property
    def ok(self) -> bool:
        return all(math.isfinite(loss) for loss in self.losses) and self.decode_diff <= DECODE_TOLERANCE


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cells",
        nargs="+",
        type=cell_name,
        default=linrnn.list_cells(),
        help="cells to run (names or aliases; default: all)",
    )
    parser.add_argument("--steps", type=positive_int, default=30, help="AdamW steps per cell (default 30)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.add_argument("--save", type=Path, metavar="DIR",
                        help="folder for the trained models (DIR/<cell>.pt; missing folders are created)")  # fmt: skip


def check_arguments(args: argparse.Namespace) -> None:
    """Before any training: ``--save`` is a folder, or a path where one can be created (its missing folders are
    made, as ``mkdir -p``, when the first checkpoint is written)."""
    save = args.save
    if save is None:
        return
    if save.exists() and not save.is_dir():
        raise UsageError(f"argument --save: expected a folder for the checkpoints (DIR/<cell>.pt), got {str(save)!r}, "
                         f"an existing file")  # fmt: skip
    existing = next(folder for folder in (save, *save.parents) if folder.exists())  # the root always exists
    if not existing.is_dir():
        raise UsageError(f"argument --save: expected a folder that can be created, got {str(save)!r} "
                         f"({str(existing)!r} is a file)")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    check_arguments(args)
    torch.set_num_threads(1)  # tiny matrices: more intra-op threads cost more in synchronisation than they save
    console = Console()
    data = text_bytes()
    with Progress(console=console, transient=True) as progress:
        results = [run_cell(cell, data, args.steps, args.seed, progress, args.save) for cell in args.cells]
    console.print(results_table(results), samples_table(results))
    if args.save is not None:
        console.print(f"checkpoints: {', '.join(str(args.save / f'{cell}.pt') for cell in args.cells)}")
    failed = [result.cell for result in results if not result.ok]
    if failed:
        console.print(f"[red]failed (non-finite loss or decode mismatch > {DECODE_TOLERANCE:g}): {', '.join(failed)}")
        return 1
    return 0


def run_cell(cell: str, data: torch.Tensor, steps: int, seed: int, progress: Progress,
             save: Path | None = None) -> DemoResult:  # fmt: skip
    torch.manual_seed(seed)
    model = linrnn.build_model(cell, preset="byte-tiny")
    task = progress.add_task(cell, total=steps)
    start = time.perf_counter()
    losses = train(model, data, steps, lambda loss: progress.update(task, advance=1, description=f"{cell} {loss:.3f}"))
    seconds = time.perf_counter() - start
    if save is not None:
        save.mkdir(parents=True, exist_ok=True)
        save_checkpoint(model, save / f"{cell}.pt")
    prompt = torch.tensor(list(PROMPT.encode("utf-8")))
    new_bytes = linrnn.generate(model, prompt, SAMPLE_BYTES, temperature=0)[len(prompt) :]
    return DemoResult(
        cell=cell,
        parameters=model.num_parameters(),
        losses=losses,
        seconds=seconds,
        decode_diff=decode_mismatch(model, data[None, :DECODE_CHECK_BYTES]),
        sample=bytes(new_bytes.tolist()).decode("utf-8", errors="replace"),
    )


def train(model: LanguageModel, data: torch.Tensor, steps: int, report: Callable[[float], None]) -> list[float]:
    """Next-byte prediction on random windows (``linrnn.training.loop.train_steps``: AdamW at a constant learning
    rate, no clipping); ``report(loss)`` after each step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    return train_steps(model, optimizer, random_windows(data), steps, on_step=lambda done: report(float(done.loss)))


def random_windows(data: torch.Tensor) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless batches of ``BATCH`` windows at random starts (drawn when a batch is asked for): inputs and their
    next bytes, each [BATCH, WINDOW]."""
    while True:
        starts = torch.randint(0, len(data) - WINDOW, (BATCH, 1))
        windows = data[starts + torch.arange(WINDOW + 1)]  # [B, WINDOW + 1]
        yield windows[:, :-1], windows[:, 1:]


@torch.no_grad()
def decode_mismatch(model: LanguageModel, ids: torch.Tensor) -> float:
    """Max |logit difference| between the full forward and feeding ``ids`` one token at a time with the state."""
    model.eval()
    full = model(ids)
    state, stepped = None, []
    for t in range(ids.shape[1]):
        logits, state = model(ids[:, t : t + 1], state=state, return_state=True)
        stepped.append(logits)
    return (torch.cat(stepped, dim=1) - full).abs().max().item()


def results_table(results: list[DemoResult]) -> Table:
    table = Table(title=f"linrnn demo: byte-tiny preset, next-byte prediction on a {len(TEXT.encode())}-byte sonnet")
    for column in ("cell", "parameters", "first loss", "last loss", "seconds", "decode diff"):
        table.add_column(column, justify="left" if column == "cell" else "right")
    for r in results:
        numbers = (f"{r.parameters:,}", f"{r.losses[0]:.3f}", f"{r.losses[-1]:.3f}", f"{r.seconds:.1f}")
        table.add_row(r.cell, *numbers, f"{r.decode_diff:.1e}")
    return table


def samples_table(results: list[DemoResult]) -> Table:
    table = Table(title=f"greedy samples after {PROMPT!r} (⏎ newline, · control byte)")
    table.add_column("cell")
    table.add_column("sample", no_wrap=True)
    for r in results:
        table.add_row(r.cell, Text("".join(printable(char) for char in r.sample)))
    return table


def printable(char: str) -> str:
    return "⏎" if char == "\n" else char if char.isprintable() else "·"
