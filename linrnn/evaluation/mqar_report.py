"""The summary of an MQAR sweep: the best learning rate per (cell, width), a rich table and the plot of accuracy
against width (as the Zoology paper's figures: the best of the learning rates, per model size)."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from rich.table import Table

from linrnn.evaluation.mqar_task import MQARSettings, chance_accuracy


def best_lr(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (cell, width), in the order the cells first appear and by width: the mean accuracy over seeds at each
    learning rate (``by_lr``), the learning rate with the best mean (``lr``; the smaller one on a tie), and at it
    the ``mean``, ``min`` and ``max`` accuracy over its ``seeds`` and the ``parameters``. A diverged run counts
    with accuracy 0."""
    groups: dict[tuple[str, int], dict[float, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        groups[row["cell"], row["width"]][row["lr"]].append(row)
    cells = list(dict.fromkeys(row["cell"] for row in rows))
    summary = []
    for cell, width in sorted(groups, key=lambda key: (cells.index(key[0]), key[1])):
        by_lr = {lr: statistics.fmean(r["accuracy"] for r in runs) for lr, runs in sorted(groups[cell, width].items())}
        lr = max(by_lr, key=lambda candidate: (by_lr[candidate], -candidate))
        accuracies = [r["accuracy"] for r in groups[cell, width][lr]]
        summary.append({
            "cell": cell, "width": width, "lr": lr, "mean": by_lr[lr], "min": min(accuracies),
            "max": max(accuracies), "seeds": len(accuracies), "by_lr": by_lr,
            "parameters": groups[cell, width][lr][0]["parameters"],
        })  # fmt: skip
    return summary


def table(summary: list[dict[str, Any]], settings: MQARSettings) -> Table:
    """One line per (cell, width): the mean accuracy at each learning rate (the best in bold), then the best one's
    seed range."""
    lrs = sorted({lr for item in summary for lr in item["by_lr"]})
    title = (f"MQAR accuracy: {settings.num_pairs} pairs in {settings.seq_len} tokens, vocabulary {settings.vocab_size}"
             f" (chance {chance_accuracy(settings.vocab_size):.3f}), {settings.steps} steps × {settings.batch_size}"
             f"; mean over seeds per learning rate")  # fmt: skip
    result = Table(title=title)
    for column in ("cell", "width", "parameters", *(f"lr {lr:g}" for lr in lrs), "best", "seed min–max", "seeds"):
        result.add_column(column, justify="left" if column == "cell" else "right")
    for item in summary:
        cells = []
        for lr in lrs:
            mean = item["by_lr"].get(lr)
            text = "-" if mean is None else f"{mean:.3f}"
            cells.append(f"[bold]{text}[/bold]" if lr == item["lr"] else text)
        result.add_row(item["cell"], str(item["width"]), f"{item['parameters']:,}", *cells, f"{item['mean']:.3f}",
                       f"{item['min']:.3f}–{item['max']:.3f}", str(item["seeds"]))  # fmt: skip
    return result


def plot(summary: list[dict[str, Any]], settings: MQARSettings, path: Path) -> None:
    """Accuracy against width (log2 axis), one line per cell: the best learning rate's mean over seeds, error bars
    from the lowest to the highest seed; a dotted line at chance. Cells are dodged slightly sideways so that their
    error bars do not hide each other."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_cell: dict[str, list[dict]] = defaultdict(list)
    for item in summary:
        by_cell[item["cell"]].append(item)
    widths = sorted({item["width"] for item in summary})
    octaves = max(1.0, math.log2(widths[-1] / widths[0]))
    figure, axes = plt.subplots(figsize=(6.4, 4.4))
    for index, (cell, items) in enumerate(by_cell.items()):
        dodge = 2 ** (0.008 * octaves * (index - (len(by_cell) - 1) / 2))  # a sideways shift, in octaves
        means = [item["mean"] for item in items]
        spread = [[item["mean"] - item["min"] for item in items], [item["max"] - item["mean"] for item in items]]
        axes.errorbar([item["width"] * dodge for item in items], means, yerr=spread, marker="o", capsize=3, label=cell)
    axes.axhline(chance_accuracy(settings.vocab_size), color="gray", linestyle=":", label="chance")
    axes.set_xscale("log", base=2)
    axes.set_xticks(widths, [str(width) for width in widths])
    axes.minorticks_off()
    axes.set_ylim(-0.02, 1.02)
    axes.set_xlabel("model width (hidden size)")
    axes.set_ylabel("accuracy (best lr: mean, seed min–max)")
    axes.set_title(f"MQAR: {settings.num_pairs} pairs in {settings.seq_len} tokens, vocabulary {settings.vocab_size}, "
                   f"{settings.num_layers} layers, {settings.steps} steps × {settings.batch_size}",
                   fontsize=10)  # fmt: skip
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=150)
    plt.close(figure)
