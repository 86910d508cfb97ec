"""Merges results files of ``linrnn eval mqar`` run with the same settings (e.g. FLA's model and linrnn's mixers
swept on different GPUs) into one: the rows of all, the table (per cell and width, with how many seeds solved the
task: accuracy ≥ 0.9) and the plot beside the output.

    python experiments/mqar_merge.py docs/results/mqar/gpu_linrnn.json docs/results/mqar/gpu_fla.json \\
        --out docs/results/mqar/gpu.json
"""

import argparse
import json
from collections import defaultdict
from pathlib import Path

from rich.console import Console

from linrnn.evaluation import mqar_report
from linrnn.evaluation.mqar_task import MQARSettings

SOLVED = 0.9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    documents = [json.loads(path.read_text()) for path in args.files]
    settings = documents[0]["settings"]
    for path, document in zip(args.files, documents, strict=True):
        if document["settings"] != settings:
            raise SystemExit(f"mqar_merge: {path} has other settings than {args.files[0]}")
    merged = {**documents[0], "rows": [row for d in documents for row in d["rows"]],
              "invocations": [i for d in documents for i in d["invocations"]]}  # fmt: skip
    args.out.write_text(json.dumps(merged, indent=1) + "\n")
    summary = mqar_report.best_lr(merged["rows"])
    mqar_settings = MQARSettings(**{k: v for k, v in settings.items() if k in MQARSettings.model_fields})
    mqar_report.plot(summary, mqar_settings, args.out.with_suffix(".png"))
    console = Console(width=200)
    console.print(mqar_report.table(summary, mqar_settings))
    solved = defaultdict(lambda: [0, 0])
    for row in merged["rows"]:
        key = row["cell"], row["width"], row["lr"]
        solved[key][0] += row["accuracy"] >= SOLVED
        solved[key][1] += 1
    for (cell, width, lr), (good, total) in sorted(solved.items()):
        print(f"{cell:16s} width {width:4d} lr {lr:g}: {good}/{total} seeds solved (accuracy >= {SOLVED})")


if __name__ == "__main__":
    main()
