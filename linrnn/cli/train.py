"""``linrnn train``: the README's main job. Trains a named config through torchtitan in a run folder (resumed if it
holds the same run), then reports validation bits per byte on the held-out documents next to the unigram
baselines, and a sample; the run's own data and tokenizer throughout (``linrnn.training.job``).

Everything is checked before anything is written: the arguments, the run folder (writable, and empty or this
run's), the data (UTF-8, enough of each split for a batch) and the torchtitan flags after ``--`` (parsed by
torchtitan's parser). Then it prints an estimate of the training time, writes the manifest and trains. Ctrl-C
stops it with one line: the step reached, the checkpoint kept and the command that resumes (exit status 130)."""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import time
from pathlib import Path

from linrnn.cli.arguments import unwritable
from linrnn.errors import UsageError
from linrnn.models import save_checkpoint
from linrnn.training import compat, job, launch, names, runs
from linrnn.training.launch import run_trainer

INTERRUPTED = 130  # a shell's exit status after Ctrl-C (128 + SIGINT)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No torchtitan import here: linrnn.training.compat must patch it first (in run)
    parser.add_argument("--cell", default="gdn", help=f"{_cell_list()} (default gdn, i.e. gated_deltanet)")
    sizes = names.training_sizes()
    parser.add_argument("--size", default="tiny", help=f"{', '.join(sizes[:-1])} or {sizes[-1]}: the model preset of "
                        "that name (linrnn presets) with the tokenizer's vocabulary (default tiny)")  # fmt: skip
    parser.add_argument("--param", default="sp", help="sp, mup or gdn-mup (default sp)")
    parser.add_argument("--steps", type=int, default=250, help="training steps (default 250)")
    parser.add_argument("--data", help="your documents: a .txt/.jsonl/.json/.parquet file, folder or glob")
    parser.add_argument("--tokenizer", help="folder with tokenizer.json and tokenizer_config.json (default: the "
                        "embedded corpus's tokenizer for the size)")  # fmt: skip
    parser.add_argument("--out", help="run folder (default outputs/<config name>); resumed if it holds this run")
    parser.add_argument("--fresh", action="store_true", help="start over: delete the run folder's linrnn outputs")
    parser.add_argument("overrides", nargs="*", help="further torchtitan flags after --, e.g. -- --optimizer.lr 1e-3")


def _cell_list() -> str:
    """The mixers as ``linrnn cells`` names them (a config name that differs in brackets), then the hybrids."""
    mixers = [registry if short == registry else f"{registry} ({short})" for short, registry in names.cells().items()
              if registry not in names.HYBRIDS]  # fmt: skip
    return f"a mixer of linrnn cells, {', '.join(mixers)}, or a hybrid, {' or '.join(names.HYBRIDS)}"


def _check(flag: str, value: str, known: dict[str, str]) -> None:
    if value not in known:
        raise UsageError(f"argument {flag}: expected one of {', '.join(known)}, got {value!r}")


def run(args: argparse.Namespace) -> int:
    # arguments, run folder and data are checked before torchtitan loads (seconds): errors come at once
    cells = names.cells()
    cell = {registry: short for short, registry in cells.items()}.get(args.cell, args.cell)
    _check("--cell", cell, cells)
    size = names.canonical_training_size(args.size, "--size")  # older spellings (paper256) resolve
    param = names.PARAMETRIZATION_ALIASES.get(args.param, args.param)
    _check("--param", param, names.PARAMETRIZATIONS)
    if args.steps < 1:
        raise UsageError(f"argument --steps: expected a positive number of steps, got {args.steps}")
    given = [flag for flag in args.overrides if flag.split("=")[0].startswith(job.DATA_FLAGS)]
    if given:
        raise UsageError(f"torchtitan flag {given[0]}: give your data and tokenizer as --data PATH and --tokenizer DIR")
    name = f"{cell}_{size}_{param}"
    out = Path(args.out or f"outputs/{name}")
    if problem := unwritable(out):
        raise UsageError(f"argument --out: expected a folder linrnn can write, got {out} ({problem})")
    data = job.run_data(names.SIZES[size].vocab, args.data, args.tokenizer)
    identity = runs.Identity(
        name, tuple(args.overrides), data.description, runs.file_sha256(data.tokenizer / "tokenizer.json")
    )
    manifest = runs.open_run(out, identity, args.steps, args.fresh)
    done = runs.latest_step(out) if manifest else 0
    if manifest and manifest.get("result") and done >= args.steps:
        result = manifest["result"]
        print(f"{name} in {out} is finished: {done} steps, validation {result['bpb']:.3f} bits per byte "
              f"(token unigram baseline {result['token_unigram_bpb']:.3f}); --steps above {done} trains on, "
              f"--fresh starts over")  # fmt: skip
        return 0 if result["bpb"] < result["token_unigram_bpb"] else 1
    device = compat.install()
    flags = ["--config", name, "--training.steps", str(args.steps), "--dump_folder", str(out)]
    flags += ["--hf_assets_path", str(data.tokenizer), "--metrics.log_freq", "25", "--validator.freq", "125"]
    flags += [*data.flags, *args.overrides]
    config = launch.parse_flags(flags)  # a flag torchtitan refuses stops here, before the manifest is written
    batch, seq_len = config.training.local_batch_size, config.training.seq_len
    if args.data is not None:
        job.check_split_sizes(data.stats, seq_len, batch, validation=config.validator.enable)
    tokens_per_step = seq_len * (config.training.global_batch_size if config.training.global_batch_size > 0 else batch)
    model_config = config.model_spec.model.model_config()
    guess = job.estimate(model_config, tokens_per_step * (args.steps - done), device, seq_len)
    if done:
        print(f"resuming {name} at step {done} from {out}")
    print(f"estimate: {_count(args.steps - done, 'step')} × {tokens_per_step:,} tokens = {guess.describe()} on this "
          f"{'GPU' if device == 'cuda' else 'CPU'}, plus start-up and validation (rate {guess.basis}); Ctrl-C stops, "
          f"the same command resumes from the last checkpoint")  # fmt: skip
    if args.fresh:
        runs.clear(out)
    runs.write_manifest(out, identity, args.steps)
    shutil.copytree(data.tokenizer, out / "tokenizer", dirs_exist_ok=True)
    started = time.perf_counter()
    try:  # until the result is in the manifest, the same command resumes (after training: evaluates) the run
        run_trainer(flags)
        seconds = time.perf_counter() - started
        model = job.load_trained(config, job.latest_checkpoint(out))
        save_checkpoint(model, out / "model.pt")
        bpb = job.validation_bpb(model, data.tokenizer, data.validation)
        baseline = data.stats["token_unigram_bpb"]
        runs.write_manifest(out, identity, args.steps, {"bpb": bpb, "token_unigram_bpb": baseline})
    except KeyboardInterrupt:
        print(_interrupted(args, out), file=sys.stderr)
        return INTERRUPTED
    job.plot_training_curve(out / "metrics.jsonl", out / "training_curve.png", tokens_per_step)
    print(
        f"\ntrained {name} to step {args.steps} ({_count(args.steps - done, 'step')}) in {seconds / 60:.1f} min; "
        f"run folder {out}: checkpoint/, model.pt, tokenizer/, metrics.jsonl, training_curve.png"
    )
    print(
        f"final validation ({data.description}, held out, {data.stats['validation_bytes']:,} bytes; each document "
        f"read whole from its start, where the validation lines above restart at every window): {bpb:.3f} bits per "
        f"byte; unigram baselines: tokens {baseline:.3f}, bytes {data.stats['byte_unigram_bpb']:.3f}"
    )
    print("\nsample:\n" + job.sample(model, data.tokenizer, data.prompt))
    if bpb >= baseline:
        print(
            f"\nexit status 1: validation {bpb:.3f} bits per byte does not beat the token unigram baseline "
            f"{baseline:.3f} (the model predicts no better than token frequencies; train longer with --steps)",
            file=sys.stderr,
        )
        return 1
    return 0


def _interrupted(args: argparse.Namespace, out: Path) -> str:
    """The one line after Ctrl-C: the step reached, the checkpoint the run resumes from, and the command."""
    command = ["linrnn", "train", "--cell", args.cell, "--size", args.size, "--param", args.param]
    command += ["--steps", str(args.steps), "--out", str(out)]  # never --fresh: that would delete the checkpoints
    for flag, value in (("--data", args.data), ("--tokenizer", args.tokenizer)):
        if value is not None:
            command += [flag, value]
    if args.overrides:
        command += ["--", *args.overrides]
    step = runs.latest_step(out)
    reached = f"after step {launch.finished_step} of {args.steps}" if launch.finished_step else "before step 1"
    kept = f"keeps the checkpoint of step {step}; resume" if step else "has no checkpoint yet; start over"
    return f"linrnn train: stopped {reached} (Ctrl-C); run folder {out} {kept} with: {shlex.join(command)}"


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
