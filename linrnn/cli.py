"""The ``linrnn`` command: ``linrnn demo``, ``linrnn cells``, ``linrnn presets``, ``linrnn stability``,
``linrnn coord-check``, ``linrnn train``, ``linrnn sweep``, ``linrnn data prepare``, ``linrnn eval mqar``,
``linrnn eval length``.

Every error in a user's arguments or input is one line on stderr, ``linrnn <command>: <message>``, with exit
status 2: argparse's (``Parser``) and ``linrnn.errors.UsageError`` raised by a command. ``--debug`` shows the
traceback of a ``UsageError`` instead; other exceptions always show theirs. Commands check their arguments before
they compute anything; the argparse types below do it per value.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

import linrnn
from linrnn.errors import UsageError, one_line
from linrnn.models import LanguageModel, ModelConfig, list_presets, model_config, save_checkpoint
from linrnn.parametrizations import coord_check
from linrnn.stability import report as stability_report
from linrnn.text import TEXT, text_bytes

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


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit:  # --help (0), or a bad argument already reported on one line (2)
        return exit.code or 0
    try:
        return args.command(args)
    except UsageError as error:
        if args.debug:
            raise
        print(f"{args.prog}: {one_line(error)}", file=sys.stderr)
        return 2


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, ``linrnn <command>: argument --x: ...`` (no usage block), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def add_command(commands, name: str, summary: str, command: Callable | None = None) -> argparse.ArgumentParser:
    """A subcommand with its own ``--debug`` (so that it may follow the command too) and its ``prog`` for errors."""
    parser = commands.add_parser(name, help=summary)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    parser.set_defaults(command=command, prog=parser.prog)
    return parser


DEBUG_HELP = "show the traceback of an error in the arguments or input instead of one line"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="linrnn", description="Linear-RNN token mixers on one recurrence.")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    demo_parser = add_command(
        commands, "demo", "train each cell's byte-tiny model briefly on a sonnet, then sample", demo
    )
    demo_parser.add_argument(
        "--cells",
        nargs="+",
        type=cell_name,
        default=linrnn.list_cells(),
        help="cells to run (names or aliases; default: all)",
    )
    demo_parser.add_argument("--steps", type=positive_int, default=30, help="AdamW steps per cell (default 30)")
    demo_parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    demo_parser.add_argument("--save", type=Path, help="directory for the trained models (DIR/<cell>.pt)")

    from linrnn import generate_cli
    from linrnn.training import evaluate as training
    from linrnn.training import sweep

    for name, summary, add_arguments, command in (
        ("stability", "spectral radius, norms and growth of each cell's transition against its certificate",
         stability_report.add_arguments, stability_report.run),
        ("coord-check", "coordinate sizes against width over a few training steps (the muP check)",
         coord_check.add_arguments, coord_check.run),
        ("sweep", "learning-rate transfer: short runs over widths × lrs × parametrizations × optimizers",
         sweep.add_arguments, sweep.run),
        ("train", "prepare the embedded corpus, train through torchtitan, report validation bpb and a sample",
         training.add_train_arguments, training.train_main),
        ("generate", "stream text from a saved model (linrnn train's model.pt, or linrnn demo --save)",
         generate_cli.add_arguments, generate_cli.run),
    ):  # fmt: skip
        add_arguments(add_command(commands, name, summary, command))
    data_parser = commands.add_parser("data", help="training data")
    data_commands = data_parser.add_subparsers(title="data commands", required=True, metavar="COMMAND")
    prepare_parser = add_command(data_commands, "prepare", "download, split and tokenize the embedded corpus",
                                 training.data_main)  # fmt: skip
    prepare_parser.add_argument("--force", action="store_true", help="prepare again even if it is there")

    from linrnn.evaluation import cli as evaluation

    eval_parser = commands.add_parser("eval", help="is a cell any good: associative recall, loss by position")
    evaluation.add_commands(eval_parser, add_command)

    add_command(commands, "cells", "list the recurrence cells and the attention mixer", cells)
    presets_parser = add_command(commands, "presets", "list the model presets with parameter counts", presets)
    presets_parser.add_argument(
        "--cell",
        type=cell_name,
        default="gated_deltanet",
        help="cell whose parameters are counted (default gated_deltanet)",
    )
    return parser


# argparse types: each checks one value; argparse reports "argument --x: <message>", or "invalid <type> value: 'x'"
# when int() or float() fails


def cell_name(name: str) -> str:
    try:
        return linrnn.get_cell(name).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def parametrization_name(name: str) -> str:
    """The canonical name of a registered parametrization (aliases such as ``gdnmup`` resolve)."""
    from linrnn import parametrizations

    try:
        return parametrizations.get(name).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def positive_int(text: str) -> int:
    return _number(text, int, lambda value: value >= 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _number(text, int, lambda value: value >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda value: value > 0, "a number > 0")


def float_in(low: float, high: float = math.inf) -> Callable[[str], float]:
    """The argparse type of a number in [low, high]."""
    expected = f"a number >= {low:g}" if high == math.inf else f"a number in [{low:g}, {high:g}]"
    return lambda text: _number(text, float, lambda value: low <= value <= high, expected)


def _number(text: str, kind: type, ok: Callable[[float], bool], expected: str):
    """``kind(text)`` if it parses and is ``ok``, else the error "expected <expected>, got <text>"."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):  # NaN is never ok
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
    return value


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"expected an existing file, got {text!r}")
    return path


def plot_file(text: str) -> Path:
    """A file name whose suffix matplotlib writes (png, pdf, svg, ...), in an existing folder: checked before
    the computation that the plot comes after."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # the plots' backend

    path = Path(text)
    formats = sorted(FigureCanvasAgg.get_supported_filetypes())
    if path.suffix.lower().removeprefix(".") not in formats:
        raise argparse.ArgumentTypeError(f"expected a file name ending in .{', .'.join(formats)}, got {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r}")
    return path


def demo(args: argparse.Namespace) -> int:
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
    """Next-byte prediction on random windows; ``report(loss)`` after each AdamW step."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=LEARNING_RATE)
    losses = []
    for _ in range(steps):
        starts = torch.randint(0, len(data) - WINDOW, (BATCH, 1))
        windows = data[starts + torch.arange(WINDOW + 1)]  # [B, WINDOW + 1]
        loss = model.loss(windows[:, :-1], windows[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        report(losses[-1])
    return losses


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


def cells(args: argparse.Namespace) -> int:
    """The recurrence cells, then the other mixers (softmax attention), each marked by its kind."""
    table = Table(title="linrnn cells")
    for column in ("name", "kind", "aliases", "decay", "erase", "recurrence"):
        table.add_column(column)
    for name in linrnn.list_mixers():
        spec = linrnn.get_cell(name)
        table.add_row(spec.name, spec.kind, ", ".join(spec.aliases) or "-", spec.decay or "-", spec.erase or "-",
                      spec.recurrence)  # fmt: skip
    Console().print(table)
    return 0


def presets(args: argparse.Namespace) -> int:
    table = Table(title=f"linrnn presets ({args.cell} parameters, tied embeddings)")
    for column in ("preset", "vocab", "hidden", "layers", "heads", "parameters"):
        table.add_column(column, justify="left" if column == "preset" else "right")
    for preset in list_presets():
        config = model_config(args.cell, preset)
        sizes = (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads)
        table.add_row(preset, *(str(size) for size in sizes), human_count(count_parameters(config)))
    Console().print(table)
    return 0


def count_parameters(config: ModelConfig) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        return LanguageModel(config).num_parameters()


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.{max(0, 2 - int(math.log10(value)))}f}{unit}"  # 3 significant digits
    return str(n)
