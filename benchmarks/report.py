"""Turns a pytest-benchmark JSON of the GPU benchmarks into the markdown table of RESULTS.md (medians, ratio to FLA)."""

import json
import sys
from collections import defaultdict


def main(path: str) -> None:
    runs = json.load(open(path))
    medians = defaultdict(dict)  # (cell, batch) -> {impl: seconds}
    prefill = defaultdict(dict)  # (cell, steps) -> {impl: seconds}
    for bench in runs["benchmarks"]:
        info = bench["extra_info"]
        if info.get("kind") == "prefill":
            prefill[(info["cell"], info["steps"])][info["impl"]] = bench["stats"]["median"]
        else:
            medians[(info["cell"], info["batch"])][info["impl"]] = bench["stats"]["median"]
    print(f"device: {runs['machine_info'].get('cpu', {}).get('brand_raw', '?')} host; {runs.get('datetime', '')}")
    print("| cell | batch | linrnn (µs) | linrnn torch path (µs) | FLA (µs) | linrnn / FLA | linrnn tokens/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for (cell, batch), impls in sorted(medians.items()):
        ours, torch_path, fla = impls.get("linrnn"), impls.get("linrnn_torch"), impls.get("fla")
        ratio = f"{ours / fla:.2f}" if ours and fla else "-"
        cells = [f"{t * 1e6:.1f}" if t else "-" for t in (ours, torch_path, fla)]
        print(f"| {cell} | {batch} | {' | '.join(cells)} | {ratio} | {batch / ours:,.0f} |")
    if prefill:
        print("\n| prefill, no grad, B = 8 | T | triton fused recurrent (ms) | torch chunked (ms) |")
        print("|---|---:|---:|---:|")
        for (cell, steps), impls in sorted(prefill.items()):
            print(f"| {cell} | {steps} | {impls['triton'] * 1e3:.2f} | {impls['torch'] * 1e3:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
