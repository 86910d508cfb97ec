"""``linrnn eval mqar`` (multi-query associative recall: accuracy against width per cell, ``linrnn.evaluation.mqar``)
and ``linrnn eval length`` (loss by token position of trained models, ``linrnn.evaluation.length``)."""

from __future__ import annotations

import argparse
import json
import time
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError
from rich.console import Console
from rich.progress import Progress

from linrnn.cli.arguments import (
    add_command,
    comma_list,
    devices,
    json_file,
    model_name,
    nonnegative_int,
    positive_float,
    positive_int,
    results_file,
)
from linrnn.errors import UsageError, one_line
from linrnn.evaluation import checkpoints, length, mqar, mqar_report, mqar_task

DEFAULT_MODELS = ("gla", "deltanet", "gdn", "kda", "gammanet", "attention")  # those the registry knows
DEFAULT_WIDTHS = (32, 64)
DEFAULT_LRS = (3e-3, 1e-2)
DEFAULT_SEEDS = (0, 1)


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Adds ``mqar`` and ``length`` under ``parser`` (the ``eval`` command)."""
    commands = parser.add_subparsers(title="eval commands", required=True, metavar="COMMAND")
    for name, summary, add_arguments, command in (
        ("mqar", "multi-query associative recall: accuracy against width per cell (a sweep, JSON and a plot)",
         add_mqar_arguments, run_mqar),
        ("length", "loss by token position of trained models on documents longer than their training length",
         add_length_arguments, run_length),
    ):  # fmt: skip
        add_arguments(add_command(commands, name, summary, command))


# linrnn eval mqar


def add_mqar_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = mqar_task.MQARSettings()
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


def default_models() -> list[str]:
    """``DEFAULT_MODELS`` that the registry knows, by their canonical names."""
    names = []
    for name in DEFAULT_MODELS:
        try:
            names.append(model_name(name))
        except argparse.ArgumentTypeError:
            continue  # "attention" before its mixer is registered
    return names


def run_mqar(args: argparse.Namespace) -> int:
    console = Console()
    if not console.is_terminal:
        console.width = max(console.width, 150)  # logs: no line wrapped or table cell cut at 80 columns
    start = time.perf_counter()
    try:
        settings = mqar_task.MQARSettings(seq_len=args.seq_len, num_pairs=args.pairs, vocab_size=args.vocab,
                                          num_layers=args.layers, num_heads=args.heads, steps=args.steps,
                                          batch_size=args.batch_size, test_examples=args.test_examples)  # fmt: skip
    except ValidationError as error:
        raise UsageError(one_line(error)) from error
    device_names = args.device or mqar.default_devices()
    mqar.check_models(args.cells, args.widths, settings, device_names)
    jobs = args.jobs or (min(mqar.usable_cores(), 16) if device_names == ["cpu"] else 1)
    document = mqar.read_results(args.out, settings)
    grid = [(name, width, lr, seed) for width in sorted(args.widths, reverse=True) for name in args.cells
            for lr in args.lrs for seed in args.seeds]  # largest first: parallel workers end together  # fmt: skip
    finished = {mqar.run_key(row["cell"], row["width"], row["lr"], row["seed"]) for row in document["rows"]}
    todo = [run for run in grid if mqar.run_key(*run) not in finished]
    workers = min(len(todo), jobs * len(device_names)) or 1
    console.print(f"{mqar.TASK}: {len(grid)} runs ({len(grid) - len(todo)} already in {args.out}), {len(todo)} to "
                  f"train on {','.join(device_names)} in {workers} process(es); chance accuracy "
                  f"{mqar_task.chance_accuracy(settings.vocab_size):.3f}")  # fmt: skip
    for done, row in enumerate(mqar.train_runs(todo, settings, device_names, workers), 1):
        document["rows"].append(row)
        mqar.write_results(args.out, document)
        result = "diverged" if row["diverged"] else f"accuracy {row['accuracy']:.3f} (test loss {row['test_loss']:.3f})"
        console.print(f"[{done}/{len(todo)}] {row['cell']} width {row['width']} lr {row['lr']:g} seed {row['seed']}: "
                      f"{result}, {row['parameters']:,} parameters, {row['seconds']:.1f} s",
                      highlight=False)  # fmt: skip
    wall = time.perf_counter() - start
    document["invocations"].append({
        "finished": datetime.now(UTC).isoformat(timespec="seconds"), "runs_trained": len(todo),
        "wall_seconds": round(wall, 1), "devices": device_names, "jobs": jobs,
    })  # fmt: skip
    mqar.write_results(args.out, document)
    keys = {mqar.run_key(*run) for run in grid}
    rows = [row for row in document["rows"]
            if mqar.run_key(row["cell"], row["width"], row["lr"], row["seed"]) in keys]  # fmt: skip
    summary = mqar_report.best_lr(rows)
    plot = args.out.with_suffix(".png")
    mqar_report.plot(summary, settings, plot)
    console.print(mqar_report.table(summary, settings))
    console.print(f"results: {args.out}; plot: {plot}; wall time {wall:.0f} s for {len(todo)} runs")
    return 0


# linrnn eval length


def add_length_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", type=Path, metavar="RUN_FOLDER",
                        help="linrnn train run folders (linrnn-run.json, model.pt, tokenizer/) or FLA folders "
                             "(config.json, safetensors, tokenizer.json)")  # fmt: skip
    parser.add_argument("--data", nargs="+", type=Path, metavar="FILE",
                        help="UTF-8 text files, one document each (default: the embedded corpus's held-out "
                             "plays)")  # fmt: skip
    parser.add_argument("--max-tokens", type=positive_int, metavar="N",
                        help="evaluate the first N tokens of longer documents (default: whole documents)")  # fmt: skip
    parser.add_argument("--labels", nargs="+", metavar="NAME", help="a name per model (default: the folder names)")
    parser.add_argument("--device", help="default: cuda when there is one, else cpu")
    parser.add_argument("--out", type=json_file, default=Path("length.json"), metavar="FILE.json",
                        help="the numbers as JSON (default length.json); the plot beside it as .png")  # fmt: skip


def run_length(args: argparse.Namespace) -> int:
    console = Console(width=max(Console().width, 120))
    labels = length.model_labels(args.runs, args.labels)
    for folder in args.runs:
        checkpoints.check_folder(folder, "argument RUN_FOLDER")
    device = checkpoints.parse_device(args.device, "argument --device")
    if args.data:
        documents, source = length.read_files(args.data), f"files: {', '.join(str(path) for path in args.data)}"
    else:
        documents, source = length.held_out_plays(console), "the held-out plays of the embedded corpus, each whole"
    results = []
    with Progress(console=console, transient=True) as progress:
        for folder, label in zip(args.runs, labels, strict=True):
            checkpoint = checkpoints.load(folder, "argument RUN_FOLDER", device)
            task = progress.add_task(label, total=len(documents))
            scored = []
            for document in documents:
                progress.update(task, description=f"{label}: {document.name}")
                scored.append(length.score_document(checkpoint, document, args.max_tokens))
                progress.advance(task)
            results.append((label, length.describe_checkpoint(checkpoint), scored))  # one model in memory at a time
    edges = length.bucket_edges(max(len(s.bits) for _, _, scored in results for s in scored))
    report = {
        "documents": [{"name": d.name, "bytes": len(d.text.encode())} for d in documents],
        "source": source,
        "max_tokens": args.max_tokens,
        "first_bucket": length.FIRST_BUCKET,
        "models": [length.model_report(label, about, scored, edges) for label, about, scored in results],
    }
    cut = f", cut to {args.max_tokens:,} tokens" if args.max_tokens else ""
    console.print(f"bits per byte by token position: {source}{cut}", length.results_table(report, edges))
    for model in report["models"]:
        cut = [f"{d['name']} ({d['tokens_before_cut']:,})" for d in model["documents"] if d["cut"]]
        if cut:
            console.print(f"{model['label']}: cut to the first {args.max_tokens:,} tokens (tokens before the cut): "
                          f"{', '.join(cut)}")  # fmt: skip
    plot_file = args.out.with_suffix(".png")
    for path in (args.out, plot_file):
        if path.exists():
            console.print(f"replacing {path}")
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    length.plot(report, plot_file)
    console.print(f"wrote {args.out} and {plot_file}")
    return 0
