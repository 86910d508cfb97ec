"""``linrnn eval mqar``: multi-query associative recall (MQAR, Arora et al. 2023, "Zoology") over cells × widths ×
learning rates × seeds; per (cell, width) the accuracy at the best learning rate with its spread over seeds.

The task, the models and one run are in ``mqar_task`` (its docstring gives zoology's layout); the table and the plot
in ``mqar_report``. Every run trains the model from scratch for a fixed number of AdamW steps on fresh examples and
is scored on one held-out set shared by all runs. Runs go to worker processes (``--jobs`` per device, over
``--device`` cuda:0,cuda:1,...; one intra-op thread each on the CPU); the parent writes each finished row into the
results JSON at once (a stopped sweep keeps its rows) and, given the same file and settings again, trains only the
missing runs. At the end: a table, the plot beside the JSON (``.png``), and the wall time.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import queue
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch
from pydantic import ValidationError

from linrnn.errors import UsageError, one_line
from linrnn.evaluation import mqar_report
from linrnn.evaluation.mqar_task import FLA_MODELS, MQARSettings, chance_accuracy, fla_available, num_parameters

TASK = "linrnn eval mqar"
DEFAULT_MODELS = ("gla", "deltanet", "gdn", "kda", "gammanet", "attention")  # those the registry knows
DEFAULT_WIDTHS = (32, 64)
DEFAULT_LRS = (3e-3, 1e-2)
DEFAULT_SEEDS = (0, 1)

Run = tuple[str, int, float, int]  # (model name, width, lr, seed)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from linrnn.cli import nonnegative_int, positive_float, positive_int

    defaults = MQARSettings()
    grid = parser.add_argument_group("grid (comma-separated lists)")
    grid.add_argument("--cells", type=comma_list(model_name, "models"), default=default_models(),
                      help="cell names or aliases, or fla-gdn / fla-kda (FLA's models, CUDA only); default: "
                           f"{', '.join(default_models())}")  # fmt: skip
    grid.add_argument("--widths", type=comma_list(positive_int, "widths"), default=list(DEFAULT_WIDTHS),
                      help=f"hidden sizes (default {','.join(map(str, DEFAULT_WIDTHS))})")  # fmt: skip
    grid.add_argument("--lrs", type=comma_list(positive_float, "learning rates"), default=list(DEFAULT_LRS),
                      help=f"AdamW peak learning rates (default {','.join(map(str, DEFAULT_LRS))})")  # fmt: skip
    grid.add_argument("--seeds", type=comma_list(nonnegative_int, "seeds"), default=list(DEFAULT_SEEDS),
                      help="seeds of the initialisation and the training examples (default 0,1)")  # fmt: skip
    task = parser.add_argument_group("task, model and training")
    for flag, field, text in (
        ("--seq-len", "seq_len", "tokens per example"),
        ("--pairs", "num_pairs", "key-value pairs per example"),
        ("--vocab", "vocab_size", "vocabulary size"),
        ("--layers", "num_layers", "blocks of the model"),
        ("--heads", "num_heads", "heads of each mixer"),
        ("--steps", "steps", "AdamW steps per run"),
        ("--batch-size", "batch_size", "examples per step"),
        ("--test-examples", "test_examples", "held-out examples scored after training"),
    ):
        default = getattr(defaults, field)
        task.add_argument(flag, type=positive_int, default=default, help=f"{text} (default {default})")
    where = parser.add_argument_group("where")
    where.add_argument("--device", "--devices", type=devices,
                       help="cpu, or CUDA devices such as cuda:0,cuda:1 (default: every visible GPU, else "
                            "cpu)")  # fmt: skip
    where.add_argument("--jobs", type=positive_int,
                       help="runs at once per device, each in its own process (default: the CPU cores, at most 16, on "
                            "cpu; 1 per GPU)")  # fmt: skip
    where.add_argument("--out", type=results_file, default=Path("mqar_results.json"),
                       help="results JSON, one row per run; the plot goes beside it as .png (default "
                            "mqar_results.json); an existing file with the same settings is resumed")  # fmt: skip


# argparse types


def model_name(text: str) -> str:
    """A canonical cell name (aliases resolve), or one of FLA's models."""
    from linrnn.recurrences.registry import canonical_name

    if text in FLA_MODELS:
        return text
    try:
        return canonical_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; or FLA's models {', '.join(FLA_MODELS)}") from error


def default_models() -> list[str]:
    """``DEFAULT_MODELS`` that the registry knows, by their canonical names."""
    names = []
    for name in DEFAULT_MODELS:
        try:
            names.append(model_name(name))
        except argparse.ArgumentTypeError:
            continue  # "attention" before its mixer is registered
    return names


def comma_list(item: Callable[[str], Any], what: str) -> Callable[[str], list]:
    """The argparse type of a comma-separated list of distinct ``item``s (at least one)."""

    def parse(text: str) -> list:
        parts = text.split(",")
        if not text.strip() or any(not part.strip() for part in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
        values = [item(part.strip()) for part in parts]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"expected distinct {what}, got {text!r} ({values})")
        return values

    return parse


def devices(text: str) -> list[str]:
    """``cpu`` or CUDA devices that exist here, comma-separated; ``cuda`` means ``cuda:0``."""
    names = []
    for name in comma_list(str, "devices")(text):
        try:
            device = torch.device(name)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {name!r}")
        if device.type == "cuda" and (index := device.index or 0) >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"expected a CUDA device that exists here ({torch.cuda.device_count()} visible), got {name!r} "
                f"(index {index})"
            )
        names.append("cpu" if device.type == "cpu" else f"cuda:{index}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct devices, got {text!r}")
    return names


def results_file(text: str) -> Path:
    """A ``.json`` file name in an existing, writable folder."""
    path = Path(text)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(f"expected a file name ending in .json (the plot goes beside it), "
                                         f"got {text!r}")  # fmt: skip
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"expected a file in a writable folder, got {text!r}")
    if path.exists() and not (path.is_file() and os.access(path, os.R_OK | os.W_OK)):
        raise argparse.ArgumentTypeError(f"expected a readable and writable file, got {text!r}")
    return path


# the command


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)  # logs: no line wrapped or table cell cut at 80 columns
    start = time.perf_counter()
    try:
        settings = MQARSettings(seq_len=args.seq_len, num_pairs=args.pairs, vocab_size=args.vocab,
                                num_layers=args.layers, num_heads=args.heads, steps=args.steps,
                                batch_size=args.batch_size, test_examples=args.test_examples)  # fmt: skip
    except ValidationError as error:
        raise UsageError(one_line(error)) from error
    device_names = args.device or default_devices()
    check_models(args.cells, args.widths, settings, device_names)
    jobs = args.jobs or (min(usable_cores(), 16) if device_names == ["cpu"] else 1)
    document = read_results(args.out, settings)
    grid = [(name, width, lr, seed) for width in sorted(args.widths, reverse=True) for name in args.cells
            for lr in args.lrs for seed in args.seeds]  # largest first: parallel workers end together  # fmt: skip
    finished = {run_key(row["cell"], row["width"], row["lr"], row["seed"]) for row in document["rows"]}
    todo = [run for run in grid if run_key(*run) not in finished]
    workers = min(len(todo), jobs * len(device_names)) or 1
    console.print(f"{TASK}: {len(grid)} runs ({len(grid) - len(todo)} already in {args.out}), {len(todo)} to train "
                  f"on {','.join(device_names)} in {workers} process(es); chance accuracy "
                  f"{chance_accuracy(settings.vocab_size):.3f}")  # fmt: skip
    for done, row in enumerate(train_runs(todo, settings, device_names, workers), 1):
        document["rows"].append(row)
        write_results(args.out, document)
        result = "diverged" if row["diverged"] else f"accuracy {row['accuracy']:.3f} (test loss {row['test_loss']:.3f})"
        console.print(f"[{done}/{len(todo)}] {row['cell']} width {row['width']} lr {row['lr']:g} seed {row['seed']}: "
                      f"{result}, {row['parameters']:,} parameters, {row['seconds']:.1f} s",
                      highlight=False)  # fmt: skip
    wall = time.perf_counter() - start
    document["invocations"].append({
        "finished": datetime.now(UTC).isoformat(timespec="seconds"), "runs_trained": len(todo),
        "wall_seconds": round(wall, 1), "devices": device_names, "jobs": jobs,
    })  # fmt: skip
    write_results(args.out, document)
    keys = {run_key(*run) for run in grid}
    rows = [row for row in document["rows"] if run_key(row["cell"], row["width"], row["lr"], row["seed"]) in keys]
    summary = mqar_report.best_lr(rows)
    plot = args.out.with_suffix(".png")
    mqar_report.plot(summary, settings, plot)
    console.print(mqar_report.table(summary, settings))
    console.print(f"results: {args.out}; plot: {plot}; wall time {wall:.0f} s for {len(todo)} runs")
    return 0


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_devices() -> list[str]:
    return [f"cuda:{index}" for index in range(torch.cuda.device_count())] or ["cpu"]


def check_models(names: list[str], widths: list[int], settings: MQARSettings, device_names: list[str]) -> None:
    """Refuses what cannot run, before anything trains: FLA's models without FLA or a GPU, and widths whose key and
    value widths (0.75 and 1.5 × width) the heads do not divide (each model is built once on the CPU)."""
    fla = [name for name in names if name in FLA_MODELS]
    if fla and importlib.util.find_spec("fla") is None:
        raise UsageError(f"argument --cells: {fla[0]} needs flash-linear-attention 0.6.0 (the package fla, with "
                         f"fla-core), which is not installed here")  # fmt: skip
    if fla and "cpu" in device_names:
        raise UsageError(f"argument --cells: {fla[0]} runs FLA's Triton kernels, which need a CUDA --device, got "
                         f"{','.join(device_names)}")  # fmt: skip
    if fla and not fla_available():
        raise UsageError(f"argument --cells: {fla[0]} needs flash-linear-attention 0.6.0, whose package fla is "
                         f"installed but fails to import (python -c 'import fla.models' shows why)")  # fmt: skip
    for name in names:
        for width in widths:
            try:
                if name in FLA_MODELS:  # linrnn's cell of the same layout names the constraint, if any
                    num_parameters(FLA_MODELS[name], width, settings)
                num_parameters(name, width, settings)
            except ValueError as error:
                raise UsageError(f"argument --widths: {name} at width {width} with --heads {settings.num_heads}: "
                                 f"{one_line(error)}") from error  # fmt: skip


def run_key(name: str, width: int, lr: float, seed: int) -> tuple[str, int, str, int]:
    return name, width, f"{lr:.6g}", seed


# the results file


def read_results(path: Path, settings: MQARSettings) -> dict[str, Any]:
    """The results document at ``path`` if it exists and holds ``settings``' runs, else a new one. A file of another
    kind, or of other settings, is refused (nothing is overwritten)."""
    fresh = {"task": TASK, "settings": settings.model_dump(mode="json"),
             "chance_accuracy": chance_accuracy(settings.vocab_size), "rows": [], "invocations": []}  # fmt: skip
    if not path.exists():
        return fresh
    try:
        document = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"argument --out: expected a {TASK} results file or a new file name, got {str(path)!r}, "
                         f"which is not JSON ({one_line(error)})") from error  # fmt: skip
    if not (isinstance(document, dict) and document.get("task") == TASK and isinstance(document.get("rows"), list)
            and isinstance(document.get("settings"), dict)):  # fmt: skip
        raise UsageError(f"argument --out: expected a {TASK} results file or a new file name, got {str(path)!r}, "
                         f"another JSON file")  # fmt: skip
    theirs, ours = document["settings"], fresh["settings"]
    differences = [f"{key} {theirs.get(key)!r} there, {ours.get(key)!r} here" for key in {**ours, **theirs}
                   if theirs.get(key) != ours.get(key)]  # fmt: skip
    if differences:
        raise UsageError(f"argument --out: {path} holds runs with other settings ({'; '.join(differences)}); choose "
                         f"another --out, or the same settings to resume")  # fmt: skip
    document.setdefault("invocations", [])
    return document


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Replaces ``path`` by ``document`` at once (a file written beside it, then renamed), so it is always whole."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    os.replace(partial, path)


# running the runs


def train_runs(runs: list[Run], settings: MQARSettings, device_names: list[str], workers: int) -> Iterator[dict]:
    """The rows of ``runs`` as they finish: in this process for one worker, else in ``workers`` spawned processes
    spread round-robin over the devices."""
    if not runs:
        return
    if workers == 1:
        device = torch.device(device_names[0])
        _configure(device)
        from linrnn.evaluation.mqar_task import held_out_set, train_run

        test = held_out_set(settings)
        for name, width, lr, seed in runs:
            yield train_run(name, width, lr, seed, settings, device, test)
        return
    yield from _rows_from_workers(runs, settings, device_names, workers)


def _configure(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:
        torch.set_num_threads(1)  # small matrices: one intra-op thread per worker beats sharing the cores


def _rows_from_workers(runs: list[Run], settings: MQARSettings, device_names: list[str], workers: int):
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    tasks, results = context.Queue(), context.Queue()
    for run in runs:
        tasks.put(run)
    for _ in range(workers):
        tasks.put(None)
    processes = [
        context.Process(
            target=_worker,
            args=(settings.model_dump_json(), device_names[index % len(device_names)], tasks, results),
            daemon=True,
        )
        for index in range(workers)
    ]
    for process in processes:
        process.start()
    try:
        running = workers
        while running:
            try:
                message = results.get(timeout=30)
            except queue.Empty:
                if not any(process.is_alive() for process in processes):
                    raise RuntimeError(f"{TASK}: the worker processes died without reporting (out of memory?); run "
                                       f"the same command again to resume") from None  # fmt: skip
                continue
            if message is None:
                running -= 1
            elif isinstance(message, str):
                raise RuntimeError(f"{TASK}: a worker failed (finished rows are kept; run again to resume):\n{message}")
            else:
                yield message
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()


def _worker(settings_json: str, device_name: str, tasks, results) -> None:
    import traceback

    try:
        from linrnn.evaluation.mqar_task import held_out_set, train_run

        settings = MQARSettings.model_validate_json(settings_json)
        device = torch.device(device_name)
        _configure(device)
        test = held_out_set(settings)
        while (run := tasks.get()) is not None:
            results.put(train_run(*run, settings, device, test))
        results.put(None)
    except Exception:
        results.put(traceback.format_exc())
