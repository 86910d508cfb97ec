"""Host time of one Triton launch on this machine: ``kernel[grid](...)`` against the compiled kernel's launcher called
directly, for a kernel with as many arguments as the chunk kernels (22 pointers and integers, 10 constexprs).

    python3 experiments/launch_overhead.py [--launches 5000]

Prints µs per launch (median of 5 rounds, each ``--launches`` back-to-back launches of a kernel that does nothing,
so the host, not the GPU, sets the pace) for: the usual launch, the direct call of ``CompiledKernel.run`` with the
arguments bound once (what a launch cache keyed on the specialization could do), and a CUDA-side floor (an empty
``torch`` op for scale).
"""

import argparse
import statistics
import time

import torch
import triton
import triton.language as tl
from triton import knobs


@triton.jit
def many_args_kernel(
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, n0, n1, n2, n3, s0, s1,
    C0: tl.constexpr, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr, C4: tl.constexpr, C5: tl.constexpr,
    C6: tl.constexpr, C7: tl.constexpr, C8: tl.constexpr, C9: tl.constexpr,
):  # fmt: skip
    if tl.program_id(0) == C0 + C1 + n0 + 1_000_000:  # never: the launch alone is timed
        tl.store(a0, s0)


def per_launch_us(launch, launches):
    rounds = []
    for _ in range(5):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            launch()
        rounds.append((time.perf_counter() - start) / launches)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(rounds)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=5000)
    args = parser.parse_args()
    buffers = [torch.empty(64, device="cuda") for _ in range(16)]
    ints, scalars = [64, 4096, 16, 128], [0.5, 1.0]
    constexprs = dict(C0=64, C1=16, C2=128, C3=128, C4=1, C5=0, C6=2, C7=1, C8=0, C9=3)
    grid = (512, 16)
    compiled = many_args_kernel[grid](*buffers, *ints, *scalars, **constexprs, num_warps=4, num_stages=2)

    def usual():
        many_args_kernel[grid](*buffers, *ints, *scalars, **constexprs, num_warps=4, num_stages=2)

    bound = [*buffers, *ints, *scalars, *constexprs.values()]
    device = torch.cuda.current_device()
    stream = torch.cuda.current_stream(device).cuda_stream

    def direct():
        metadata = compiled.launch_metadata(grid, stream, *bound)
        compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, metadata,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound)  # fmt: skip

    empty = torch.empty(0, device="cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__)
    for name, launch in (("kernel[grid](...)", usual), ("CompiledKernel.run", direct), ("torch add (empty)",
                         lambda: empty.add_(1))):  # fmt: skip
        print(f"{name:24s} {per_launch_us(launch, args.launches):6.1f} µs per launch")


if __name__ == "__main__":
    main()
