"""Learning-rate transfer sweeps: a grid of short training runs over cells × optimizers × parametrizations ×
widths × learning rates on the embedded corpus, one row per run in a JSON-lines table, resumable.

Each run uses the training stack of ``linrnn.train`` without torchtitan's ``Trainer`` around it (whose start-up
would cost more than a small run): the model is ``TitanLanguageModel`` initialised by its ``init_weights`` (the
parametrization applied on the CPU from the run seed), the optimizer is ``ParametrizedOptimizers`` (the
parametrization's per-role learning rates), the schedule is torchtitan's warmup + cosine, the batches come from
``WindowDataLoader`` (packed documents with positions) and validation runs over the whole held-out set. The steps
are ``linrnn.training.loop.train_steps``'s: bf16 autocast on CUDA, fp32 on CPU; cross-entropy over the non-ignored
targets; gradient clipping; a step.

At the base width every parametrization is the same model (``parametrizations.apply``), so a grid point there
is trained once and its row is written for each parametrization (``shared`` names the one that ran).

Several worker processes can share one GPU (``workers``): small widths are bound by the host's kernel launches,
so the GPU takes several runs at once. Only the main process writes the table.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from linrnn.errors import UsageError
from linrnn.recurrences.registry import canonical_name

OPTIMIZER_NAMES = {"adamw": "AdamW", "sgd": "SGD"}
PARAMETRIZATIONS = ("sp", "mup", "gdn-mup")


class SweepConfig(BaseModel):
    """The grid and the training settings shared by every run of a sweep. Defaults: the GDN-muP paper's GDN family (8
    layers, 6 heads, key/value widths 0.75/1.5 × width, MLP 4 × width) at widths 128 to 1024, 7 log-spaced
    learning rates per optimizer over the paper's ranges, a 4096-token vocabulary with an untied readout that
    starts at zero (Tensor Programs V), 10% linear warmup then cosine decay, gradient clipping at 1."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    cells: list[str] = ["gated_deltanet"]
    optimizers: list[Literal["adamw", "sgd"]] = ["adamw", "sgd"]
    parametrizations: list[str] = list(PARAMETRIZATIONS)
    widths: list[int] = [128, 256, 512, 1024]
    base_width: int | None = Field(None, description="default: the smallest width")
    lrs: dict[str, list[float]] = Field(
        # the GDN-muP paper's ranges (AdamW 1e-3..3e-2, SGD 0.1..1 in 7 steps) with two more steps on the side where
        # GDN's optimum sat at the edge (docs/sweeps.md)
        default_factory=lambda: {"adamw": log_grid(1e-3, 9.32e-2, 9), "sgd": log_grid(0.0464, 1.0, 9)},
        description="learning rates per optimizer (the base value; the parametrization scales each role's)",
    )
    num_layers: int = Field(8, gt=0)
    num_heads: int = Field(6, gt=0)
    vocab_size: int = 4096  # the embedded corpus's tokenizer
    seq_len: int = Field(512, gt=0)
    batch_size: int = Field(32, gt=0)
    steps: int = Field(100, gt=0)
    warmup_fraction: float = Field(0.1, ge=0, lt=1)
    min_lr_factor: float = Field(0.01, ge=0, le=1, description="cosine decays to lr × this")
    weight_decay: dict[str, float] = Field(default_factory=lambda: {"adamw": 0.1, "sgd": 0.0})
    betas: tuple[float, float] = (0.9, 0.95)
    momentum: float = 0.98  # SGD, Nesterov (the GDN-muP paper's §6)
    max_norm: float = Field(1.0, gt=0)
    readout_zero_init: bool = True
    readout_bias: bool = False  # a learned logit bias outside the logit multiplier (docs/sweeps.md, SGD)
    # heads grow with width (num_heads at the base width), so head dimensions stay the base width's (docs/sweeps.md)
    heads_grow: bool = False
    validation_batches: int | None = Field(None, gt=0, description="default: the whole held-out set")
    seed: int = 0

    @field_validator("cells")
    @classmethod
    def _cells(cls, cells: list[str]) -> list[str]:
        return [canonical_name(cell) for cell in cells]

    @field_validator("parametrizations")
    @classmethod
    def _parametrizations(cls, names: list[str]) -> list[str]:
        from linrnn import parametrizations

        return [parametrizations.get(name).name for name in names]

    @model_validator(mode="after")
    def _grid(self) -> SweepConfig:
        for optimizer in self.optimizers:
            lrs = self.lrs.get(optimizer)
            if not lrs:
                raise ValueError(f"lrs: no learning rates for optimizer {optimizer!r}; got lrs for {sorted(self.lrs)}")
            if any(lr <= 0 for lr in lrs) or len({f"{lr:.6g}" for lr in lrs}) != len(lrs):
                raise ValueError(f"lrs[{optimizer!r}] must be distinct positive numbers (to 6 digits), got {lrs}")
            if optimizer not in self.weight_decay:
                raise ValueError(f"weight_decay: no value for optimizer {optimizer!r}")
        if self.base_width is not None and self.base_width not in self.widths:
            raise ValueError(f"base_width must be one of the widths {self.widths}, got {self.base_width}")
        if len(set(self.widths)) != len(self.widths) or any(w < 1 for w in self.widths):
            raise ValueError(f"widths must be distinct positive integers, got {self.widths}")
        if self.heads_grow and any(w * self.num_heads % self.base for w in self.widths):
            raise ValueError(f"heads_grow: every width × num_heads ({self.num_heads}) must be a multiple of the base "
                             f"width {self.base}, got widths {self.widths}")  # fmt: skip
        return self

    @property
    def base(self) -> int:
        return self.base_width or min(self.widths)

    def heads(self, width: int) -> int:
        """The head count at ``width``: ``num_heads``, or with ``heads_grow`` num_heads · width / base."""
        return self.num_heads * width // self.base if self.heads_grow else self.num_heads

    @property
    def tokens_per_run(self) -> int:
        return self.steps * self.batch_size * self.seq_len

    def settings(self) -> dict:
        """The training settings: everything but the grid axes (with the base width resolved)."""
        settings = self.model_dump(exclude={"cells", "optimizers", "parametrizations", "widths", "lrs"})
        for added_later in ("readout_bias", "heads_grow"):  # off: tables written before them keep their hash
            if not settings[added_later]:
                del settings[added_later]
        return {**settings, "base_width": self.base}

    def settings_hash(self) -> str:
        """Identifies the training settings, so a table mixes no settings."""
        return hashlib.sha1(json.dumps(self.settings(), sort_keys=True).encode()).hexdigest()[:12]

    def runs(self) -> list[Run]:
        """Every grid point: cell by cell and optimizer by optimizer (a sweep cut short leaves whole figures),
        largest width first (so parallel workers end together)."""
        return [
            Run(cell=cell, optimizer=optimizer, parametrization=param, width=width, lr=lr)
            for cell in self.cells
            for optimizer in self.optimizers
            for width in sorted(self.widths, reverse=True)
            for param in self.parametrizations
            for lr in self.lrs[optimizer]
        ]


class Run(BaseModel):
    model_config = ConfigDict(frozen=True)

    cell: str
    optimizer: str
    parametrization: str
    width: int
    lr: float

    def key(self, settings: str) -> str:
        return f"{self.cell}/{self.optimizer}/{self.parametrization}/w{self.width}/lr{self.lr:.6g}/{settings}"

    def label(self) -> str:
        return f"{self.cell} {self.optimizer} {self.parametrization} w{self.width} lr {self.lr:.3g}"


def log_grid(low: float, high: float, count: int) -> list[float]:
    """``count`` log-spaced values from ``low`` to ``high``, rounded to 3 significant digits."""
    if not (0 < low < high) or count < 2:
        raise ValueError(f"log_grid needs 0 < low < high and count >= 2, got low={low}, high={high}, count={count}")
    return [float(f"{value:.3g}") for value in np.geomspace(low, high, count)]


# ----------------------------------------------------------------------------------------------------------
# the table


def read_table(path: str | Path) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as error:
                raise UsageError(f"{path}:{number}: not a JSON row ({error}); remove or repair the line") from None
    return rows


def append_rows(path: Path, rows: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as table:
        for row in rows:
            table.write(json.dumps(row) + "\n")


def pending(config: SweepConfig, table: Path) -> dict[Run, list[Run]]:
    """Runs to train → the grid points each one's row is written for; grid points already in the table (with
    the same settings) are left out. Grid points whose parametrizations give the same model and optimizer
    groups (every parametrization at the base width; muP and GDN-muP under AdamW) are trained once."""
    settings = config.settings_hash()
    done = {row["key"] for row in read_table(table)}
    signatures: dict[Run, str] = {}
    todo: dict[Run, list[Run]] = {}
    for run in config.runs():
        if run.key(settings) in done:
            continue
        for param in config.parametrizations:
            candidate = run.model_copy(update={"parametrization": param})
            for point in (candidate, run):
                if point not in signatures:
                    signatures[point] = training_signature(config, point)
            if signatures[candidate] == signatures[run]:
                todo.setdefault(candidate, []).append(run)
                break
    return todo


def training_signature(config: SweepConfig, run: Run) -> str:
    """What the parametrization does at this grid point: every parameter's init scale and lr multiplier, the
    logit and pre-norm multipliers (shapes only: the model is built on the meta device)."""
    from linrnn import parametrizations
    from linrnn.models import LanguageModel

    spec = model_spec(config, run)
    with torch.device("meta"):
        model = LanguageModel(spec.model_config())
        applied = parametrizations.apply(
            model, run.parametrization, base_width=spec.base_width, optimizer=run.optimizer,
            readout_zero_init=spec.readout_zero_init,
        )  # fmt: skip
    rules = sorted((name, rule.init_scale, rule.lr) for name, rule in applied.rules.items())
    multipliers = [model.config.logit_multiplier, *(layer.mixer.config.output_multiplier for layer in model.layers)]
    return json.dumps([rules, multipliers])


# ----------------------------------------------------------------------------------------------------------
# one run


class Corpus:
    """The training and validation windows of the embedded corpus, tokenized once per process."""

    def __init__(self, config: SweepConfig):
        from torchtitan.components.tokenizer import HuggingFaceTokenizer

        from linrnn.training import data
        from linrnn.training.loader import WindowDataLoader

        data.register_datasets()
        data.prepare(vocab_sizes=(config.vocab_size,), log=lambda message: None)
        tokenizer = HuggingFaceTokenizer(tokenizer_path=str(data.tokenizer_dir(config.vocab_size)))
        sizes = dict(seq_len=config.seq_len, local_batch_size=config.batch_size, dp_world_size=1, dp_rank=0)
        self.train = WindowDataLoader(
            WindowDataLoader.Config(dataset="shakespeare", seed=config.seed), tokenizer=tokenizer, **sizes
        )
        self.validation = WindowDataLoader(
            WindowDataLoader.Config(dataset="shakespeare_validation", infinite=False), tokenizer=tokenizer, **sizes
        )
        self.bytes_per_token = data.corpus_stats()["tokenizers"][str(config.vocab_size)]["bytes_per_token"]

    def batches(self, loader) -> Iterator[tuple[dict, torch.Tensor]]:
        loader.load_state_dict({"calls": 0})  # every run sees the same batches from the start
        return iter(loader)


def model_spec(config: SweepConfig, run: Run):
    """The ``TitanLanguageModel.Config`` of one grid point: the GDN-muP paper's family at the run's width."""
    from linrnn.training.model import TitanLanguageModel

    return TitanLanguageModel.Config(
        cell=run.cell,
        preset="byte-tiny",
        overrides=dict(
            vocab_size=config.vocab_size,
            hidden_size=run.width,
            num_layers=config.num_layers,
            num_heads=config.heads(run.width),
            intermediate_size=4 * run.width,
            tie_embeddings=not config.readout_zero_init,
            readout_bias=config.readout_bias,
        ),
        parametrization=run.parametrization,
        base_width=config.base,
        optimizer=run.optimizer,
        readout_zero_init=config.readout_zero_init,
        base_num_heads=config.num_heads if config.heads_grow else None,
        seed=config.seed,
    )


def build_model(config: SweepConfig, run: Run, device: torch.device):
    """``TitanLanguageModel`` at the run's width, initialised as in ``linrnn.train`` (parametrized on the CPU from
    the seed, then copied to ``device``)."""
    from linrnn.training.model import TitanLanguageModel

    with torch.device("meta"):
        model = TitanLanguageModel(model_spec(config, run))
    model.to_empty(device=device)
    model.init_weights()
    return model


def train_run(config: SweepConfig, run: Run, corpus: Corpus, device: torch.device) -> dict:
    """Trains one grid point (``linrnn.training.loop.train_steps``); returns its table row (without key and
    shared)."""
    from torchtitan.components.loss import IGNORE_INDEX
    from torchtitan.components.optimizer import LRSchedulersContainer

    from linrnn.training.loop import Step, train_steps
    from linrnn.training.optim import ParametrizedOptimizers

    torch.manual_seed(config.seed)
    model = build_model(config, run, device)
    optimizers = ParametrizedOptimizers(
        ParametrizedOptimizers.Config(
            name=OPTIMIZER_NAMES[run.optimizer],
            lr=run.lr,
            weight_decay=config.weight_decay[run.optimizer],
            betas=config.betas,
            momentum=config.momentum if run.optimizer == "sgd" else 0.0,
            nesterov=run.optimizer == "sgd" and config.momentum > 0,
            implementation="fused" if device.type == "cuda" else "foreach",
        ),
        model_parts=[model],
    )
    schedulers = LRSchedulersContainer.Config(
        warmup_steps=max(1, round(config.warmup_fraction * config.steps)),
        decay_type="cosine",
        min_lr_factor=config.min_lr_factor,
    ).build(optimizers=optimizers, training_steps=config.steps)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")  # validation's

    by_role = defaultdict(list)  # role → parameters, for the gradient norms per role
    for name, parameter in model.model.named_parameters():
        by_role[model.applied.roles[name]].append(parameter)
    losses, grad_norms, role_norms, diverged = [], [], [], False  # per step, kept on the device (no sync)

    def loss(model, batch: tuple[dict, torch.Tensor]) -> torch.Tensor:  # the loss path: no [B, T, vocab] logits
        inputs, labels = batch
        return model.model.loss(inputs["input"].to(device), labels.to(device),
                                positions=inputs["positions"].to(device), ignore_index=IGNORE_INDEX)  # fmt: skip

    def record_role_norms(step: int) -> None:  # before clipping
        if step % 10 == 1:  # the steps of loss_curve
            role_norms.append(torch.stack([_grad_norm(parameters) for parameters in by_role.values()]))

    def record(done: Step) -> bool:
        """Keeps the loss and gradient norm; stops the run when a loss of the last 25 steps is not finite."""
        nonlocal diverged
        losses.append(done.loss)
        grad_norms.append(done.grad_norm)
        if done.step % 25 == 0 or done.step == config.steps:  # checked every 25 steps: a check reads the device
            diverged = not torch.isfinite(torch.stack(losses[-25:])).all()
        return diverged

    start = time.perf_counter()
    curve = train_steps(
        model, optimizers, corpus.batches(corpus.train), config.steps, loss=loss, schedule=schedulers,
        max_norm=config.max_norm, autocast=torch.bfloat16 if device.type == "cuda" else None,
        on_gradients=record_role_norms, on_step=record,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    validation = None if diverged else validation_loss(model, corpus, device, autocast, config.validation_batches)
    diverged = diverged or validation is None or not math.isfinite(validation)
    tokens = len(curve) * config.batch_size * config.seq_len
    return {
        **run.model_dump(),
        "base_width": config.base,
        "steps": len(curve),
        "tokens": tokens,
        "train_loss": None if diverged else float(np.mean(curve[-25:])),
        "val_loss": None if diverged else validation,
        "val_bpb": None if diverged else validation / math.log(2) / corpus.bytes_per_token,
        "diverged": diverged,
        "loss_curve": [round(x, 4) if math.isfinite(x) else None for x in curve[::10]],  # every 10th step
        # the global gradient norm before clipping at max_norm, and per parametrization role, every 10th step
        "grad_norm_curve": _rounded(torch.stack(grad_norms).cpu().tolist()[::10]),
        "role_grad_norms": dict(zip(by_role, map(_rounded, torch.stack(role_norms).T.cpu().tolist()), strict=True)),
        "parameters": sum(p.numel() for p in model.parameters()),
        "seconds": round(seconds, 2),  # training only
        "tokens_per_second": round(tokens / seconds),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "settings": config.settings(),
    }


def _grad_norm(parameters: list[torch.Tensor]) -> torch.Tensor:
    grads = [p.grad for p in parameters if p.grad is not None]
    return torch.nn.utils.get_total_norm(grads) if grads else torch.zeros((), device=parameters[0].device)


def _rounded(values: list[float]) -> list[float | None]:
    return [float(f"{x:.4g}") if math.isfinite(x) else None for x in values]


@torch.no_grad()
def validation_loss(model, corpus: Corpus, device: torch.device, autocast, batches: int | None) -> float:
    """Mean cross-entropy (nats per target token) over the held-out set (its first ``batches``, or all of it)."""
    from torchtitan.components.loss import IGNORE_INDEX

    model.eval()
    nats = torch.zeros((), device=device, dtype=torch.float64)
    targets = torch.zeros((), device=device, dtype=torch.long)
    for index, (inputs, labels) in enumerate(corpus.batches(corpus.validation)):
        if batches is not None and index == batches:
            break
        with autocast:
            logits = model(inputs["input"].to(device), positions=inputs["positions"].to(device))
        labels = labels.to(device).flatten()
        nats += F.cross_entropy(logits.flatten(0, 1).float(), labels, ignore_index=IGNORE_INDEX, reduction="sum")
        targets += (labels != IGNORE_INDEX).sum()
    model.train()
    return float(nats / targets)


# ----------------------------------------------------------------------------------------------------------
# the grid


def run_sweep(
    config: SweepConfig,
    table: str | Path,
    *,
    workers: int = 1,
    time_limit: float | None = None,
    device: str | None = None,
    on_result: Callable[[dict, int, int], None] | None = None,
    todo: dict[Run, list[Run]] | None = None,
) -> int:
    """Trains every grid point missing from ``table`` and appends its rows; returns the number of runs trained.
    ``time_limit`` (seconds): no run starts after it (runs in progress finish). ``on_result(row, done, total)``
    is called after each run. ``todo``: ``pending(config, table)`` when the caller has it already."""
    table = Path(table)
    todo = pending(config, table) if todo is None else todo
    settings = config.settings_hash()
    deadline = None if time_limit is None else time.monotonic() + time_limit
    target = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    results = (
        _results_in_process(config, list(todo), target, deadline)
        if workers == 1
        else _results_in_workers(config, list(todo), target, deadline, workers)
    )
    done = 0
    for run, row in results:
        rows = []
        for point in todo[run]:
            shared = None if point == run else run.parametrization
            rows.append({**row, "parametrization": point.parametrization, "key": point.key(settings), "shared": shared})
        append_rows(table, rows)
        done += 1
        if on_result is not None:
            on_result(row, done, len(todo))
    return done


def _results_in_process(config, runs, device, deadline) -> Iterator[tuple[Run, dict]]:
    corpus = Corpus(config)
    for run in runs:
        if deadline is not None and time.monotonic() > deadline:
            return
        yield run, train_run(config, run, corpus, device)


def _results_in_workers(config, runs, device, deadline, workers) -> Iterator[tuple[Run, dict]]:
    import torch.multiprocessing as mp

    context = mp.get_context("spawn")
    tasks, results = context.Queue(), context.Queue()
    for index in range(len(runs)):
        tasks.put(index)
    for _ in range(workers):
        tasks.put(None)
    processes = [
        context.Process(
            target=_worker,
            args=(
                config.model_dump_json(),
                [r.model_dump() for r in runs],
                str(device),
                deadline,
                workers,
                tasks,
                results,
            ),
            daemon=True,
        )  # fmt: skip
        for _ in range(workers)
    ]
    for process in processes:
        process.start()
    finished = 0
    try:
        while finished < workers:
            try:
                message = results.get(timeout=60)
            except queue.Empty:
                if not any(process.is_alive() for process in processes):  # killed (out of memory, a signal)
                    raise RuntimeError("the sweep workers died without reporting; resume with --workers 1") from None
                continue
            if message is None:
                finished += 1
            elif isinstance(message, str):
                raise RuntimeError(f"a sweep worker failed:\n{message}")
            else:
                index, row = message
                yield runs[index], row
    finally:
        for process in processes:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()


def _worker(config_json, runs, device, deadline, workers, tasks, results) -> None:
    import traceback

    try:
        config = SweepConfig.model_validate_json(config_json)
        if device == "cpu":  # the workers share the cores
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // workers))
        corpus = Corpus(config)
        while (index := tasks.get()) is not None:
            if deadline is not None and time.monotonic() > deadline:
                continue  # drain: no new runs after the time limit
            results.put((index, train_run(config, Run(**runs[index]), corpus, torch.device(device))))
        results.put(None)
    except Exception:
        results.put(traceback.format_exc())


# ----------------------------------------------------------------------------------------------------------
# the report


def write_report(config: SweepConfig, table: Path, out: Path, console) -> int:
    """Writes ``{table stem}_report.md`` and ``{table stem}_lr_transfer_{cell}_{optimizer}.png`` into ``out``;
    prints the summary."""
    from linrnn.training import sweep_report

    settings = config.settings_hash()
    rows = [row for row in read_table(table) if row["key"].endswith(f"/{settings}")]
    if not rows:
        console.print(f"[red]linrnn sweep: no rows in {table} with these settings ({settings}); nothing to report")
        return 1
    curves = sweep_report.collect(rows)
    out.mkdir(parents=True, exist_ok=True)
    report = out / f"{table.stem}_report.md"
    report.write_text(sweep_report.markdown(curves, rows[0]["settings"]))
    files = sweep_report.plot(curves, out, prefix=table.stem)
    trained = {Run(**{key: row[key] for key in Run.model_fields}) for row in rows}
    missing = len(set(config.runs()) - trained)
    console.print(sweep_report.best_table(curves) + "\n\n" + sweep_report.fitted_table(curves))
    console.print(f"report: {report}; plots: {', '.join(map(str, files))}")
    if missing:
        console.print(f"[yellow]{missing} grid points not trained yet: run the same command again to resume")
    return 0
