"""Host time of the Triton chunk ops without a GPU: every kernel launch of ``triton/chunk.py`` replaced by a no-op, so
what remains is the Python (validation, buffers, launch arguments, autograd) a call costs before its kernels.

    TRITON_INTERPRET=1 python experiments/host_stub.py [--cells gated_deltanet kda] [--calls 2000] [--top 20]

Prints the median µs of a forward and of a forward + backward per cell (tiny CPU inputs, 1 × 64 tokens, one head,
K = V = 128, bf16), then cProfile's top functions by own time. On the GPU the launches themselves add Triton's
per-launch cost (``experiments/host_overhead.py`` times the real calls there); compare trees with this script on one
machine only.
"""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import time

import torch
import torch.nn.functional as F

from linrnn import ops
from linrnn.kernels.triton import chunk


class _NoLaunch:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` does nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def stub_kernels():
    for name in dir(chunk):
        if name.endswith("_kernel"):
            setattr(chunk, name, _NoLaunch())


def make_op(cell):
    torch.manual_seed(0)
    shape = (1, 64, 1, 128)
    q = torch.randn(shape).bfloat16()
    k = F.normalize(torch.randn(shape), dim=-1).bfloat16()
    v = torch.randn(shape).bfloat16()
    g_head, g_chan = F.logsigmoid(torch.randn(shape[:3]) + 3), F.logsigmoid(torch.randn(shape) + 3)
    beta = torch.rand(shape[:3]).sigmoid()
    leaves = [q, k, v, g_chan if cell == "kda" else g_head, beta]
    for x in leaves:
        x.requires_grad_(True)
    do = torch.randn(shape).bfloat16()
    if cell == "kda":
        forward = lambda: ops.kda(q, k, v, g_chan, beta, backend="triton")[0]  # noqa: E731
    else:
        forward = lambda: ops.gated_delta_rule(q, k, v, g_head, beta, backend="triton")[0]  # noqa: E731
    return forward, lambda: torch.autograd.grad(forward(), leaves, do)


def median_us(run, calls):
    for _ in range(20):
        run()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1e6 * statistics.median(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=["gated_deltanet", "kda"], choices=["gated_deltanet", "kda"])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("host_stub.py: set TRITON_INTERPRET=1 (the ops take CPU tensors on the Triton path only then)")
    stub_kernels()
    for cell in args.cells:
        forward, forward_backward = make_op(cell)
        fwd, both = median_us(forward, args.calls), median_us(forward_backward, args.calls)
        print(f"{cell}: host µs per call, median of {args.calls}: forward {fwd:.1f}, forward + backward {both:.1f}")
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(args.calls // 4):
            forward_backward()
        profiler.disable()
        text = io.StringIO()
        pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(args.top)
        print("\n".join(line for line in text.getvalue().splitlines() if line.strip()))


if __name__ == "__main__":
    main()
