"""Validation loss against tokens for each family and variant of a parity run (experiments/parity_fla.py's JSON
lines): the mean over seeds with the seed range shaded, one panel per family; and a table of the last evaluation.

    python experiments/parity_plot.py parity.jsonl parity.png
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

LABELS = {"fla": "FLA 0.6.0 model", "linrnn-normal": "linrnn, conv_init=normal (FLA's init)",
          "linrnn-uniform": "linrnn, conv_init=uniform (the default)"}  # fmt: skip


def main(source: str, target: str) -> None:
    rows = [json.loads(line) for line in open(source) if "valid_loss" in line]
    curves = defaultdict(lambda: defaultdict(list))  # (family, variant) -> tokens -> losses over seeds
    for row in rows:
        curves[row["family"], row["variant"]][row["tokens"]].append(row["valid_loss"])
    families = sorted({family for family, _ in curves})
    figure, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 4), squeeze=False)
    print("| family | variant | seeds | validation loss at the end (mean, min–max) | best (mean over seeds) |")
    print("|---|---|---|---|---|")
    for axis, family in zip(axes[0], families, strict=True):
        for (fam, variant), points in sorted(curves.items()):
            if fam != family:
                continue
            tokens = sorted(points)
            means = [statistics.mean(points[t]) for t in tokens]
            axis.plot([t / 1e6 for t in tokens], means, "o-", ms=3, label=LABELS.get(variant, variant))
            axis.fill_between([t / 1e6 for t in tokens], [min(points[t]) for t in tokens],
                              [max(points[t]) for t in tokens], alpha=0.2)  # fmt: skip
            last = points[tokens[-1]]
            spread = f"{statistics.mean(last):.3f} ({min(last):.3f}–{max(last):.3f})"
            print(f"| {family} | {variant} | {len(last)} | {spread} | {min(means):.3f} |")
        axis.set(title=family.upper(), xlabel="training tokens (millions)", ylabel="validation loss (nats per token)")
        axis.set_ylim(top=min(axis.get_ylim()[1], 5.5))
        axis.legend()
    figure.tight_layout()
    figure.savefig(target, dpi=120)


if __name__ == "__main__":
    main(*sys.argv[1:])
