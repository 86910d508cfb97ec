"""Summarises ``metrics.jsonl`` files of training runs (linrnn.training.metrics) for benchmarks/RESULTS.md.

    python scripts/train_report.py NAME=RUN_DIR [NAME=RUN_DIR ...] [--skip 10]

Per run: steps, first and last loss, validation bpb, median tokens/s per device and MFU over the logged steps
after ``--skip`` (compilation and autotuning), then the tokens/s ratio of every run against the first, and the
largest loss difference between runs over their common steps.
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
    args = parser.parse_args()
    runs = dict(run.split("=", 1) for run in args.runs)
    summary, losses = {}, {}
    print("| run | steps | loss first → last | validation bpb | tokens/s per device (median) | MFU % |")
    print("|---|---:|---|---:|---:|---:|")
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
        print(
            f"| {name} | {train[-1]['step']} | {train[0]['loss']:.3f} → {train[-1]['loss']:.3f} | "
            f"{validation[-1] if validation else float('nan'):.3f} | {tps:,.0f} | "
            f"{statistics.median(mfu) if mfu else float('nan'):.1f} |"
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


if __name__ == "__main__":
    main()
