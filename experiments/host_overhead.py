"""Host time of the chunkwise ops: what a call costs when the GPU has almost nothing to do, and where the Python
time goes (cProfile), for linrnn's op and FLA 0.6.0's.

Run on the device with the carried wheels on PYTHONPATH::

    python3 experiments/host_overhead.py [--cells gated_deltanet kda] [--shape 1x64] [--top 25]

At a tiny shape the call + sync median is the host's time per call (the launches are queued faster than they run
only when the kernels take longer than the Python that issues them); the pytest benchmarks time every shape that
way, so this time is part of their forward and forward+backward numbers.
"""

import argparse
import cProfile
import io
import os
import pstats

import torch
from profile_chunk import fla_op, linrnn_op, make_inputs, wall_median  # this script's folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=["gated_deltanet", "kda"])
    parser.add_argument("--shape", default="1x64")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--no-fla", action="store_true", help="linrnn only (FLA autotunes each new shape cold)")
    args = parser.parse_args()
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    batch, steps = map(int, args.shape.split("x"))
    x, d_o = make_inputs(batch, steps, 1, 128)
    leaves = list(x.values())
    for cell in args.cells:
        for name, make in (("linrnn", linrnn_op), ("FLA", fla_op))[: 1 if args.no_fla else 2]:
            forward = make(cell, x)

            def forward_backward(forward=forward):
                torch.autograd.grad(forward(), leaves, d_o, allow_unused=True)

            fwd, fwd_bwd = wall_median(forward, args.calls), wall_median(forward_backward, args.calls)
            print(
                f"{cell} {name} {args.shape}: call + sync median fwd {1e3 * fwd:.0f} µs, fwd+bwd {1e3 * fwd_bwd:.0f} µs"
            )
            if name != "linrnn":
                continue
            for label, run in (("forward", forward), ("forward+backward", forward_backward)):
                profiler = cProfile.Profile()
                profiler.enable()
                for _ in range(args.calls):
                    run()
                torch.cuda.synchronize()
                profiler.disable()
                text = io.StringIO()
                pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
                print(f"-- {cell} linrnn {label}: cProfile over {args.calls} calls, by own time")
                print("\n".join(line for line in text.getvalue().splitlines() if line.strip())[:6000])


if __name__ == "__main__":
    main()
