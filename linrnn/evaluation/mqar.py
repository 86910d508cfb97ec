"""What ``linrnn eval mqar`` runs: multi-query associative recall (MQAR, Arora et al. 2023, "Zoology") over
cells × widths × learning rates × seeds; per (cell, width) the accuracy at the best learning rate with its spread
over seeds. The command line is ``linrnn.cli.evaluation``.

The task, the models and one run are in ``mqar_task`` (its docstring gives zoology's layout); the table and the plot
in ``mqar_report``. Every run trains the model from scratch for a fixed number of AdamW steps on fresh examples and
is scored on one held-out set shared by all runs. Runs go to worker processes (``--jobs`` per device, over
``--device`` cuda:0,cuda:1,...; one intra-op thread each on the CPU); the parent writes each finished row into the
results JSON at once (a stopped sweep keeps its rows) and, given the same file and settings again, trains only the
missing runs. At the end: a table, the plot beside the JSON (``.png``), and the wall time.
"""

from __future__ import annotations

import importlib.util
import json
import os
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from linrnn.errors import UsageError, one_line
from linrnn.evaluation.mqar_task import FLA_MODELS, MQARSettings, chance_accuracy, fla_available, num_parameters

TASK = "linrnn eval mqar"

Run = tuple[str, int, float, int]  # (model name, width, lr, seed)


# devices, and what is checked before anything trains


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
