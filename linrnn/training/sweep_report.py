"""The report of a learning-rate sweep: per (cell, optimizer, parametrization) and width, the validation loss
against the learning rate shifted by that width's best (as the GDN-muP paper plots it), the best learning rate, and the
transfer score: the largest distance, in steps of the learning-rate grid, between a width's best learning rate
and the base width's (0: the optimum stays put; diverged runs count as worse than any finished one, and a width
where every run diverged counts as the largest possible distance), and the transfer regret: the largest loss, over
widths, of training at the base width's best learning rate instead of the width's own best (what zero-shot transfer
costs, in nats per token; less sensitive than the argmin to run-to-run noise in a flat basin). Where a basin is
flat, the argmin is decided by noise; the fitted optimum (the vertex of a parabola in log lr through a width's
finished runs) and the fitted shift (its largest distance from the base width's, in grid steps) describe where
the basin's centre moves instead."""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

PARAMETRIZATION_LABELS = {"sp": "SP", "mup": "muP", "gdn-mup": "GDN-muP"}


@dataclass
class Curves:
    """One (cell, optimizer, parametrization): ``losses[width][lr]`` = final validation loss (None: diverged)."""

    cell: str
    optimizer: str
    parametrization: str
    base_width: int
    lrs: list[float]  # the grid of this (cell, optimizer), sorted
    losses: dict[int, dict[float, float | None]] = field(default_factory=dict)

    @property
    def widths(self) -> list[int]:
        return sorted(self.losses)

    def best(self, width: int) -> tuple[float, float] | None:
        """(lr, loss) of the lowest finished validation loss at ``width``; None if every run diverged."""
        finished = [(loss, lr) for lr, loss in self.losses[width].items() if loss is not None]
        if not finished:
            return None
        loss, lr = min(finished)
        return lr, loss

    def best_index(self, width: int) -> int | None:
        best = self.best(width)
        return None if best is None else self.lrs.index(best[0])

    def at_edge(self, width: int) -> bool:
        """The best lr is the smallest or largest of the grid (the true optimum may lie outside)."""
        index = self.best_index(width)
        return index is not None and index in (0, len(self.lrs) - 1)

    def shifted(self, width: int) -> dict[float, float | None]:
        best = self.best(width)
        return {lr: None if loss is None or best is None else loss - best[1] for lr, loss in self.losses[width].items()}

    def transfer_score(self) -> int | None:
        """max over widths of |best-lr grid index − the base width's|; None without a finished base-width run."""
        if self.base_width not in self.losses or self.best_index(self.base_width) is None:
            return None
        base = self.best_index(self.base_width)
        worst = len(self.lrs) - 1  # a width where every run diverged has no optimum on the grid at all
        return max(worst if (index := self.best_index(w)) is None else abs(index - base) for w in self.widths)

    def transfer_regret(self) -> float | None:
        """max over widths of the shifted loss at the base width's best lr (inf where that run diverged); widths
        without a run at that lr are left out. None without a finished base-width run."""
        if self.base_width not in self.losses or (base := self.best(self.base_width)) is None:
            return None
        regrets = [self.shifted(w).get(base[0], 0.0) for w in self.widths]
        return max(math.inf if r is None else r for r in regrets)

    def fitted_lr(self, width: int) -> float | None:
        """The vertex of the least-squares parabola in log lr through the width's finished runs (at least 3).
        None where the parabola opens downward or its vertex lies outside the runs' lr range (no interior
        optimum)."""
        finished = sorted((lr, loss) for lr, loss in self.losses.get(width, {}).items() if loss is not None)
        if len(finished) < 3:
            return None
        log_lrs = np.log([lr for lr, _ in finished])
        curvature, slope, _ = np.polyfit(log_lrs, [loss for _, loss in finished], 2)
        if curvature <= 0:
            return None
        vertex = -slope / (2 * curvature)
        return float(np.exp(vertex)) if log_lrs[0] <= vertex <= log_lrs[-1] else None

    def fitted_shift(self) -> float | None:
        """max over widths of |log(fitted lr / the base width's fitted lr)|, in grid steps (the median log ratio
        of neighbouring grid lrs); None where the base width or any other width has no fitted optimum."""
        fitted = {w: self.fitted_lr(w) for w in self.widths}
        if self.base_width not in fitted or any(lr is None for lr in fitted.values()):
            return None
        step = float(np.median(np.diff(np.log(self.lrs))))  # a fitted optimum needs 3 lrs, so there are steps
        return max(abs(math.log(lr / fitted[self.base_width])) for lr in fitted.values()) / step


def collect(rows: list[dict]) -> list[Curves]:
    """Rows of one sweep (same settings) → curves, ordered by cell, optimizer and parametrization."""
    grids: dict[tuple[str, str], set[float]] = defaultdict(set)
    for row in rows:
        grids[row["cell"], row["optimizer"]].add(row["lr"])
    curves: dict[tuple[str, str, str], Curves] = {}
    for row in rows:
        key = (row["cell"], row["optimizer"], row["parametrization"])
        if key not in curves:
            curves[key] = Curves(*key, base_width=row["base_width"], lrs=sorted(grids[key[:2]]))
        curves[key].losses.setdefault(row["width"], {})[row["lr"]] = None if row["diverged"] else row["val_loss"]
    order = list(PARAMETRIZATION_LABELS)
    return sorted(curves.values(), key=lambda c: (c.cell, c.optimizer, order.index(c.parametrization)
                                                   if c.parametrization in order else len(order)))  # fmt: skip


def mean_over_seeds(tables: dict[str, list[dict]]) -> tuple[list[dict], dict[tuple, float | None]]:
    """Rows of several sweeps that differ only in their seed (table name → rows) → one row per grid point run in
    every table, with the mean validation loss (diverged if any seed diverged), and each point's spread over the
    seeds (max − min; None where one diverged). The rows' settings get the list of seeds."""
    reference_name, reference = None, None
    points: dict[tuple, list[dict]] = defaultdict(list)
    seeds = []
    for name, rows in tables.items():
        if not rows:
            raise ValueError(f"mean_over_seeds: table {name} has no rows")
        settings = {key: value for key, value in rows[0]["settings"].items() if key != "seed"}
        if reference is None:
            reference_name, reference = name, settings
        elif settings != reference:
            differ = sorted(k for k in settings.keys() | reference.keys() if settings.get(k) != reference.get(k))
            raise ValueError(f"mean_over_seeds: table {name}'s settings differ from {reference_name}'s in {differ}, "
                             "expected only the seed to differ")  # fmt: skip
        seed = rows[0]["settings"]["seed"]
        if seed in seeds:
            raise ValueError(f"mean_over_seeds: table {name} has seed {seed}, already in another table; expected "
                             "one table per seed")  # fmt: skip
        seeds.append(seed)
        for row in rows:
            points[row["cell"], row["optimizer"], row["parametrization"], row["width"], row["lr"]].append(row)
    mean_rows, spread = [], {}
    for point, rows in points.items():
        if len(rows) < len(tables):
            continue  # not run under every seed
        diverged = any(row["diverged"] for row in rows)
        losses = [row["val_loss"] for row in rows]
        spread[point] = None if diverged else max(losses) - min(losses)
        mean_rows.append({**rows[0], "diverged": diverged, "val_loss": None if diverged else float(np.mean(losses)),
                          "settings": {**rows[0]["settings"], "seed": sorted(seeds)}})  # fmt: skip
    return mean_rows, spread


def best_table(curves: list[Curves]) -> str:
    """Markdown table: the best lr (and its loss) per width, the transfer score and the transfer regret."""
    widths = _all_widths(curves)
    lines = [
        "| cell | optimizer | parametrization | " + " | ".join(f"best lr, width {w}" for w in widths)
        + " | transfer score | transfer regret |",
        "|---|---|---|" + "---|" * (len(widths) + 2),
    ]  # fmt: skip
    for c in curves:
        cells = []
        for width in widths:
            best = c.best(width) if width in c.losses else None
            cells.append(
                "–" if best is None else f"{best[0]:.3g}{' (edge)' if c.at_edge(width) else ''} ({best[1]:.3f})"
            )
        score = c.transfer_score()
        lines.append(
            f"| {c.cell} | {c.optimizer} | {_label(c)} | {' | '.join(cells)} | {'–' if score is None else score} "
            f"| {_regret(c)} |"
        )
    return "\n".join(lines)


def fitted_table(curves: list[Curves]) -> str:
    """Markdown table: the fitted optimum per width and the fitted shift."""
    widths = _all_widths(curves)
    lines = [
        "| cell | optimizer | parametrization | " + " | ".join(f"fitted lr, width {w}" for w in widths)
        + " | fitted shift (grid steps) |",
        "|---|---|---|" + "---|" * (len(widths) + 1),
    ]  # fmt: skip
    for c in curves:
        fitted = [c.fitted_lr(w) if w in c.losses else None for w in widths]
        values = " | ".join("–" if lr is None else f"{lr:.3g}" for lr in fitted)
        lines.append(f"| {c.cell} | {c.optimizer} | {_label(c)} | {values} | {_shift(c)} |")
    return "\n".join(lines)


def markdown(curves: list[Curves], settings: dict) -> str:
    """The report as markdown: the summary tables (best and fitted learning rates, transfer scores), then the
    shifted losses of every width."""
    lines = [
        best_table(curves),
        "",
        "Best lr per width with its validation loss (nats per token) in brackets; (edge): the best lr is at "
        "the end of the grid. Transfer score: largest distance in grid steps from the base width's best lr. "
        "Transfer regret: largest loss (nats per token) over widths of training at the base width's best lr instead "
        "of the width's own best.",
        "",
        fitted_table(curves),
        "",
        "Fitted lr: the vertex of a least-squares parabola in log lr through the width's finished runs (–: it "
        "opens downward, or its vertex lies outside the runs' range). Fitted shift: the largest distance of a "
        "width's fitted lr from the base width's, in grid steps; where the basin is flat it is less sensitive to "
        "noise than the transfer score.",
        "",
    ]
    tokens = settings["steps"] * settings["batch_size"] * settings["seq_len"]
    heads = f"{settings['num_heads']} heads" + (" at the base width, growing with width (head dimensions fixed)"
                                                 if settings.get("heads_grow") else "")  # fmt: skip
    lines.append(f"Settings: {settings['num_layers']} layers, {heads}, base width "
                 f"{curves[0].base_width if curves else '?'}, {settings['steps']} steps × {settings['batch_size']} × "
                 f"{settings['seq_len']} tokens = {tokens:,} tokens per run, warmup {settings['warmup_fraction']:.0%} "
                 f"then cosine to {settings['min_lr_factor']:g} × lr, seed {settings['seed']}.")  # fmt: skip
    for c in curves:
        lines += ["", f"### {c.cell}, {c.optimizer}, {_label(c)}: validation loss − best of the width", ""]
        lines.append("| width | " + " | ".join(f"{lr:.3g}" for lr in c.lrs) + " |")
        lines.append("|---|" + "---|" * len(c.lrs))
        for width in c.widths:
            shifted = c.shifted(width)
            values = ["" if lr not in shifted else "diverged" if shifted[lr] is None else f"{shifted[lr]:.3f}"
                      for lr in c.lrs]  # fmt: skip
            lines.append(f"| {width} | " + " | ".join(values) + " |")
    return "\n".join(lines) + "\n"


def plot(curves: list[Curves], out_dir: str | Path, prefix: str = "sweep") -> list[Path]:
    """One figure per (cell, optimizer), the parametrizations side by side: shifted validation loss against lr,
    one line per width, the best lr starred, diverged runs as × on the top edge. Returns the files."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    groups: dict[tuple[str, str], list[Curves]] = defaultdict(list)
    for c in curves:
        groups[c.cell, c.optimizer].append(c)
    files = []
    for (cell, optimizer), panels in groups.items():
        widths = sorted({w for c in panels for w in c.widths})
        colors = dict(zip(widths, matplotlib.colormaps["viridis"](np.linspace(0, 0.9, len(widths))), strict=True))
        finite = [v for c in panels for w in c.widths for v in c.shifted(w).values() if v is not None]
        top = min(1.0, max(finite, default=0.1) * 1.1 + 0.02)
        figure, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.6), sharey=True, squeeze=False)
        for axis, c in zip(axes[0], panels, strict=True):
            for width in c.widths:
                shifted = c.shifted(width)
                lrs = [lr for lr in c.lrs if shifted.get(lr) is not None]
                axis.plot(lrs, [min(shifted[lr], top) for lr in lrs], "o-", ms=3, color=colors[width], label=f"{width}")
                diverged = [lr for lr in c.lrs if lr in shifted and shifted[lr] is None]
                axis.plot(diverged, [top] * len(diverged), "x", color=colors[width], ms=6)
                if (best := c.best(width)) is not None:
                    axis.plot([best[0]], [0.0], "*", color=colors[width], ms=11, mec="black", mew=0.5)
            score = c.transfer_score()
            axis.set_title(f"{_label(c)}: score {'–' if score is None else score}, regret {_regret(c)}, "
                           f"fitted shift {_shift(c)}", fontsize=9)  # fmt: skip
            axis.set_xscale("log")
            axis.set_xlabel(f"learning rate ({optimizer})")
            axis.set_ylim(-0.02 * top, top * 1.03)
            axis.grid(alpha=0.3, which="both")
        axes[0][0].set_ylabel("validation loss − best of the width")
        axes[0][-1].legend(title="width", fontsize=8)
        figure.suptitle(f"{cell}: learning-rate transfer, {optimizer}")
        figure.tight_layout()
        # prefix: the table's stem, so tables can share a folder
        path = out_dir / f"{prefix}_lr_transfer_{cell}_{optimizer}.png"
        figure.savefig(path, dpi=130)
        plt.close(figure)
        files.append(path)
    return files


def _all_widths(curves: list[Curves]) -> list[int]:
    return sorted({w for c in curves for w in c.widths})


def _label(c: Curves) -> str:
    return PARAMETRIZATION_LABELS.get(c.parametrization, c.parametrization)


def _shift(c: Curves) -> str:
    shift = c.fitted_shift()
    return "–" if shift is None else f"{shift:.1f}"


def _regret(c: Curves) -> str:
    regret = c.transfer_regret()
    return "–" if regret is None else "diverged" if math.isinf(regret) else f"{regret:.3f}"
