"""``linrnn train``: the README's main job. Trains a named config through torchtitan in a run folder (resumed if it
holds the same run), then reports validation bits per byte on the held-out documents next to the unigram
baselines, and a sample; the run's own data and tokenizer throughout (``linrnn.training.job``)."""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

from linrnn.errors import UsageError
from linrnn.models import save_checkpoint
from linrnn.training import compat, job, names, runs
from linrnn.training.launch import flag_value, run_trainer


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # No torchtitan import here: linrnn.training.compat must patch it first (in run)
    cells = list(names.cells())
    parser.add_argument("--cell", default="gdn", help=f"{', '.join(cells[:-1])} or {cells[-1]} (default gdn)")
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


def _check(flag: str, value: str, known: dict[str, str]) -> None:
    if value not in known:
        raise UsageError(f"argument {flag}: expected one of {', '.join(known)}, got {value!r}")


def run(args: argparse.Namespace) -> int:
    # arguments, data and run folder are checked before torchtitan loads (seconds): errors come at once
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
    if done:
        print(f"resuming {name} at step {done} from {out}")
    compat.install()
    from linrnn.training import configs

    runs.write_manifest(out, identity, args.steps)
    shutil.copytree(data.tokenizer, out / "tokenizer", dirs_exist_ok=True)
    started = time.perf_counter()
    flags = ["--config", name, "--training.steps", str(args.steps), "--dump_folder", str(out)]
    flags += ["--hf_assets_path", str(data.tokenizer), "--metrics.log_freq", "25", "--validator.freq", "125"]
    run_trainer([*flags, *data.flags, *args.overrides])
    seconds = time.perf_counter() - started
    config = configs.build(cells[cell], size, configs.PARAMETRIZATIONS[param])
    model = job.load_trained(config, job.latest_checkpoint(out))
    save_checkpoint(model, out / "model.pt")
    bpb = job.validation_bpb(model, data.tokenizer, data.validation)
    baseline = data.stats["token_unigram_bpb"]
    runs.write_manifest(out, identity, args.steps, {"bpb": bpb, "token_unigram_bpb": baseline})
    batch = int(flag_value(args.overrides, "--training.local_batch_size") or config.training.local_batch_size)
    seq_len = int(flag_value(args.overrides, "--training.seq_len") or config.training.seq_len)
    job.plot_training_curve(out / "metrics.jsonl", out / "training_curve.png", batch * seq_len)
    print(
        f"\ntrained {name} to step {args.steps} ({_count(args.steps - done, 'step')}) in {seconds / 60:.1f} min; "
        f"run folder {out}: checkpoint/, model.pt, tokenizer/, metrics.jsonl, training_curve.png"
    )
    print(
        f"validation ({data.description}, held out; {data.stats['validation_bytes']:,} bytes): {bpb:.3f} bits per "
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


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")
