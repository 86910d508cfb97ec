"""Where a profiled training step's time goes, from a PyTorch profiler trace (Chrome JSON, ``.json`` or
``.json.gz``; torchtitan writes ``<dump>/profiling/traces/iteration_<N>/rank0_trace.json.gz``).

    python3 experiments/trace_summary.py TRACE [--top 30]

Prints the profiled step's wall time (its ``ProfilerStep#`` span), the GPU's busy time in it (the union of kernel
and memcpy intervals) and so the GPU's idle share (a step with a large idle share is host-bound: Python, hooks
and launches), then the top GPU kernels by total time and the top CPU operators by time spent in them.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import sys


def load(path: str) -> list[dict]:
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        return json.load(handle)["traceEvents"]


def busy_time(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    events = [e for e in load(args.trace) if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    if steps:
        step = max(steps, key=lambda e: e["dur"])
        start, end = step["ts"], step["ts"] + step["dur"]
    else:
        step = None
        start = min(e["ts"] for e in events)
        end = max(e["ts"] + e["dur"] for e in events)
    inside = [e for e in events if start <= e["ts"] < end]
    gpu = [e for e in inside if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    busy = busy_time([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    wall = end - start
    print(f"step {step['name'] if step else '(whole trace)'}: wall {wall / 1e3:.1f} ms, GPU busy {busy / 1e3:.1f} ms "
          f"({100 * busy / wall:.0f}%), idle {(wall - busy) / 1e3:.1f} ms")  # fmt: skip
    kernels = collections.defaultdict(lambda: [0.0, 0])
    for e in gpu:
        kernels[e["name"]][0] += e["dur"]
        kernels[e["name"]][1] += 1
    print(f"\n{'GPU kernel':<90} {'ms':>8} {'calls':>6} {'share':>6}")
    for name, (total, calls) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{name[:90]:<90} {total / 1e3:8.2f} {calls:6d} {100 * total / busy:5.1f}%")
    cpu = collections.defaultdict(lambda: [0.0, 0])
    for e in inside:
        if e.get("cat") in ("cpu_op", "python_function", "user_annotation") and e is not step:
            cpu[e["name"]][0] += e["dur"]
            cpu[e["name"]][1] += 1
    print(f"\n{'CPU operator (inclusive; nested ones overlap)':<90} {'ms':>8} {'calls':>6}")
    for name, (total, calls) in sorted(cpu.items(), key=lambda kv: -kv[1][0])[: args.top]:
        print(f"{name[:90]:<90} {total / 1e3:8.2f} {calls:6d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
