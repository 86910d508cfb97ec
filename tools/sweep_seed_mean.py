"""The report of several sweep tables that differ only in their seed: mean validation loss per grid point (points
run under every seed), the transfer summaries of the means, the plots, and the spread over seeds.

    python tools/sweep_seed_mean.py docs/results/sweeps/gdn_sgd_heads_grow{,_seed1,_seed2,_seed3}.jsonl \\
        --out docs/results/sweeps/gdn_sgd_heads_grow_seeds
writes gdn_sgd_heads_grow_seeds_report.md and gdn_sgd_heads_grow_seeds_lr_transfer_{cell}_{optimizer}.png.
"""

import argparse
from pathlib import Path

import numpy as np

from linrnn.training import sweep_report
from linrnn.training.sweep import read_table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("tables", nargs="+", type=Path, help="sweep tables (JSON lines), one per seed")
    parser.add_argument("--out", type=Path, required=True, help="path prefix of the report and the plots")
    args = parser.parse_args()
    rows, spread = sweep_report.mean_over_seeds({str(table): read_table(table) for table in args.tables})
    if not rows:
        raise SystemExit("sweep_seed_mean: no grid point was run under every seed")
    curves = sweep_report.collect(rows)
    finished = [value for value in spread.values() if value is not None]
    lines = [sweep_report.markdown(curves, rows[0]["settings"]), "### Spread over seeds (max − min of a point)", ""]
    if finished:
        lines += [f"{len(spread)} grid points, {len(args.tables)} seeds: median {np.median(finished):.3f}, "
                  f"largest {max(finished):.3f} nats per token.", ""]  # fmt: skip
    lrs = curves[0].lrs
    lines += ["| cell | optimizer | parametrization | width | " + " | ".join(f"{lr:.3g}" for lr in lrs) + " |",
              "|---|---|---|---|" + "---|" * len(lrs)]  # fmt: skip
    for c in curves:
        for width in c.widths:
            cells = []
            for lr in c.lrs:
                point = (c.cell, c.optimizer, c.parametrization, width, lr)
                value = spread.get(point)
                cells.append("" if point not in spread else "diverged" if value is None else f"{value:.3f}")
            lines.append(f"| {c.cell} | {c.optimizer} | {c.parametrization} | {width} | " + " | ".join(cells) + " |")
    report = args.out.parent / f"{args.out.name}_report.md"
    report.parent.mkdir(parents=True, exist_ok=True)
    report.write_text("\n".join(lines) + "\n")
    files = sweep_report.plot(curves, args.out.parent, prefix=args.out.name)
    print(sweep_report.best_table(curves) + "\n\n" + sweep_report.fitted_table(curves))
    print(f"report: {report}; plots: {', '.join(map(str, files))}")


if __name__ == "__main__":
    main()
