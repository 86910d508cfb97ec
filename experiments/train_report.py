"""Summarises ``metrics.jsonl`` files of training runs (linrnn.training.metrics) for benchmarks/RESULTS.md.

    python experiments/train_report.py NAME=RUN_DIR [NAME=RUN_DIR ...] [--skip 10]

Per run: steps, first and last loss, validation bpb, median tokens/s per device and MFU over the logged steps
after ``--skip`` (compilation and autotuning), then the tokens/s ratio of every run against the first, and the
largest loss difference between runs over their common steps. ``--config NAME`` (a linrnn.training config) adds
the MFU counted as 6·N·tokens (N: all parameters, the tied readout's matmul standing for the embedding) beside the
logged one (``flops_per_token``: 6·N without the embedding, plus the readout and the recurrence), and the mean
loss of each run per window of 50 steps.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def load(folder: str) -> list[dict]:
    return [json.loads(line) for line in (Path(folder) / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("runs", nargs="+", help="NAME=FOLDER")
    parser.add_argument("--skip", type=int, default=10, help="ignore tokens/s of steps up to this one")
    parser.add_argument("--config", help="the runs' config name: adds MFU as 6·N·tokens and windowed mean losses")
    parser.add_argument("--window", type=int, default=50, help="steps per window of mean losses (default 50)")
    args = parser.parse_args()
    six_n_ratio = mfu_6n_ratio(args.config) if args.config else None
    runs = dict(run.split("=", 1) for run in args.runs)
    summary, losses = {}, {}
    extra = " MFU % (6·N) |" if six_n_ratio else ""
    print(f"| run | steps | loss first → last | validation bpb | tokens/s per device (median) | MFU % |{extra}")
    print("|---|---:|---|---:|---:|---:|" + ("---:|" if six_n_ratio else ""))
    for name, folder in runs.items():
        try:
            records = load(folder)
        except FileNotFoundError:
            print(f"| {name} | no metrics.jsonl in {folder} | | | | |")
            continue
        train = [r for r in records if "loss" in r]
        losses[name] = {r["step"]: r["loss"] for r in train}
        timed = [r for r in train if r["step"] > args.skip and r.get("tokens_per_s")]
        tps = statistics.median(r["tokens_per_s"] for r in timed) if timed else float("nan")
        mfu = [r["mfu"] for r in timed if r.get("mfu") is not None]
        validation = [r["validation_bpb"] for r in records if r.get("validation_bpb") is not None]
        summary[name] = tps
        median_mfu = statistics.median(mfu) if mfu else float("nan")
        print(
            f"| {name} | {train[-1]['step']} | {train[0]['loss']:.3f} → {train[-1]['loss']:.3f} | "
            f"{f'{validation[-1]:.3f}' if validation else '—'} | {tps:,.0f} | {median_mfu:.1f} |"
            + (f" {median_mfu * six_n_ratio:.1f} |" if six_n_ratio else "")
        )
    names = list(summary)
    for name in names[1:]:
        print(f"tokens/s per device, {name} / {names[0]}: {summary[name] / summary[names[0]]:.3f}")
    for name in list(losses)[1:]:
        first = losses[list(losses)[0]]
        common = sorted(set(first) & set(losses[name]))
        if common:
            worst = max(common, key=lambda s: abs(first[s] - losses[name][s]))
            print(
                f"largest |loss difference| {name} vs {list(losses)[0]} over {len(common)} steps: "
                f"{abs(first[worst] - losses[name][worst]):.4f} at step {worst}"
            )
    if args.config and len(losses) > 1:
        last = max(max(steps) for steps in losses.values())
        windows = [(start, min(start + args.window - 1, last)) for start in range(1, last + 1, args.window)]
        print(f"\nmean logged loss per window of {args.window} steps")
        first_name, others = list(losses)[0], list(losses)[1:]
        print("| steps | " + " | ".join(losses) + " | " + " | ".join(f"{n} − {first_name}" for n in others) + " |")
        print("|---|" + "---:|" * (2 * len(losses) - 1))
        for lo, hi in windows:
            means = {n: statistics.mean([v for s, v in run.items() if lo <= s <= hi] or [float("nan")])
                     for n, run in losses.items()}  # fmt: skip
            diffs = [means[n] - means[first_name] for n in others]
            print(f"| {lo}–{hi} | " + " | ".join(f"{m:.4f}" for m in means.values()) + " | "
                  + " | ".join(f"{d:+.4f}" for d in diffs) + " |")  # fmt: skip


def mfu_6n_ratio(config_name: str) -> float:
    """(6 · all parameters) / the flops per token the logged MFU uses, for the named config."""
    import torch

    from linrnn.models import LanguageModel
    from linrnn.models.config import model_config
    from linrnn.training import compat

    compat.install()
    from linrnn.training import configs
    from linrnn.training.model import flops_per_token

    canonical = configs.canonical_config_name(config_name)
    if canonical is None:
        raise SystemExit(f"train_report.py: --config {config_name!r} names no linrnn.training config")
    cell, size, _ = configs.parse_config_name(canonical)
    model_cell, pattern = configs.resolve_cell(configs.cells()[cell])
    layers = {"layer_pattern": pattern} if pattern else {}
    config = model_config(model_cell, size, **configs.SIZES[size].overrides, **layers)  # size NAME: preset NAME
    with torch.device("meta"):
        parameters = LanguageModel(config).num_parameters()
    return 6 * parameters / flops_per_token(config, seq_len=configs.SIZES[size].seq_len)  # seq_len: attention


if __name__ == "__main__":
    main()
