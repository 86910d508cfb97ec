"""Compares linrnn's chunkwise-op timings of two source trees (before and after a change) from pytest-benchmark
JSONs of benchmarks/test_chunk_gpu.py, several runs each, taken alternately in one device call
(``experiments/gpu_compare_trees.sh`` does that).

    python benchmarks/compare_runs.py --before old_1.json old_2.json --after new_1.json new_2.json

Per cell, shape and mode: the median over runs of each run's median, the spread (max/min over runs) and the ratio
after / before; a ratio inside the spread of either side is noise.
"""

import argparse
import json
import statistics
from collections import defaultdict


def medians(paths: list[str]) -> dict[tuple, list[float]]:
    """(cell, shape, mode) -> the run medians in ms, linrnn's rows only."""
    out = defaultdict(list)
    for path in paths:
        for bench in json.load(open(path))["benchmarks"]:
            info = bench["extra_info"]
            if info.get("kind") == "chunk" and info["impl"] == "linrnn":
                out[(info["cell"], info["shape"], info["mode"])].append(bench["stats"]["median"] * 1e3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", nargs="+", required=True, help="JSONs of the tree before the change")
    parser.add_argument("--after", nargs="+", required=True, help="JSONs of the tree after the change")
    args = parser.parse_args()
    before, after = medians(args.before), medians(args.after)
    print("| cell | B×T | mode | before (ms) | spread | after (ms) | spread | after / before |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    ratios = []
    for key in sorted(before.keys() & after.keys()):
        old, new = statistics.median(before[key]), statistics.median(after[key])
        ratios.append(new / old)
        spreads = [f"{max(runs) / min(runs):.3f}" for runs in (before[key], after[key])]
        print(f"| {' | '.join(key)} | {old:.3f} | {spreads[0]} | {new:.3f} | {spreads[1]} | {new / old:.3f} |")
    if ratios:
        print(f"\ngeometric mean of after / before over {len(ratios)} rows: {statistics.geometric_mean(ratios):.3f}")


if __name__ == "__main__":
    main()
