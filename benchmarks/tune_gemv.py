"""Launch-shape sweep of the decoding matrix-vector kernel (``linrnn/kernels/triton/gemv.py``) on the GPU against
``F.linear`` (cuBLAS), at the 340M GDN's decoding GEMMs: device time per call inside a CUDA graph of 20 or more calls
(as the engine replays them: no host launch in the timing; median of 10 replays), each call reading its own copy of
the weight from DRAM (as a decoding step does; the copies do not fit in L2), and the weight bytes read per µs.
``--fused``: each product with the elementwise step before it in the kernel's prologue (add + RMSNorm, gated RMSNorm,
SwiGLU) against that step's own kernel followed by the plain product.

    python benchmarks/tune_gemv.py [--rows 1 8] [--fused] [--plain readout ...]
"""

import argparse
import itertools
import math

import torch
import torch.nn.functional as F

from linrnn.kernels.triton.gemv import gemv

SHAPES = {  # (N, K) of the 340M GDN: the mixer's projection, o_proj, MLP gate+up, down, the readout
    "projection": (4672, 1024),
    "o_proj": (1024, 1536),
    "gate_up": (5632, 1024),
    "down": (1024, 2816),
    "readout": (32000, 1024),
}

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--rows", type=int, nargs="+", default=[1])
parser.add_argument("--fused", action="store_true", help="the products with their fused inputs")
parser.add_argument("--plain", nargs="*", choices=list(SHAPES), help="the plain products to sweep (default: all, or "
                    "none with --fused)")  # fmt: skip
cli = parser.parse_args()

LAUNCH_SHAPES = list(itertools.product([2, 4, 8, 16], [256, 512, 1024, 2048], [1, 2, 4, 8]))  # (W rows, K, warps)


def registers(rows: int, block_n: int, block_k: int, warps: int) -> float:
    """Accumulator registers a thread holds."""
    return rows * block_n * block_k / (32 * warps)


COLD_BYTES = 160e6  # weights read per timed graph: past the H100's 50 and the H200's 60 MB of L2


def timed(fn, *args, cold: torch.Tensor | None = None, replays: int = 10, **kwargs) -> float:
    """Median µs of one ``fn(*args, **kwargs)`` inside a CUDA graph of at least 20 calls. ``cold``: the weight among
    the arguments; each call reads its own copy of it, enough copies that they do not fit in L2, so the weight
    comes from DRAM as in a decoding step (which reads each weight once)."""
    copies = [cold] if cold is None else [cold.clone() for _ in range(math.ceil(COLD_BYTES / cold.nbytes))]
    calls = max(20, len(copies))

    def call(i: int):
        def swap(a):
            return copies[i % len(copies)] if cold is not None and a is cold else a

        fn(*(swap(a) for a in args), **{k: swap(v) for k, v in kwargs.items()})

    call(0)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            call(i)
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def fused_cases(rows: int):
    """(name, N, K, the fused launch's keyword arguments, the unfused step + product) at the 340M GDN."""
    from linrnn.kernels.fused import gated_rms_norm, rms_norm, swiglu
    from linrnn.kernels.triton import gemv as kernels

    def bf16(*shape):
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    x, delta, norm = bf16(rows, 1024), bf16(rows, 1024), bf16(1024)
    for name in ("projection", "gate_up"):
        columns, depth = SHAPES[name]
        weight = bf16(columns, depth)
        fused = dict(x=x, weight=weight, bias=None, depth=depth, prologue=kernels.RMS_NORM, aux=delta,
                     norm_weight=norm, total=torch.empty_like(x), eps=1e-6)  # fmt: skip
        yield (
            name + " + add, RMSNorm",
            columns,
            depth,
            fused,
            lambda w: gemv(rms_norm(x, norm, 1e-6, delta, "triton")[0], w),
        )
    o, z, head_norm, weight = bf16(rows, 1, 6, 256), bf16(rows, 1, 6, 256), bf16(256), bf16(*SHAPES["o_proj"])
    fused = dict(x=o.view(rows, -1), weight=weight, bias=None, depth=1536, prologue=kernels.GATED_RMS_NORM,
                 aux=z.view(rows, -1), norm_weight=head_norm, eps=1e-6, group=256, min_block_k=256)  # fmt: skip
    yield (
        "o_proj + gated RMSNorm",
        1024,
        1536,
        fused,
        lambda w: gemv(gated_rms_norm(o, z, head_norm, 1e-6, "triton").view(rows, -1), w),
    )
    both, weight = bf16(rows, 5632), bf16(*SHAPES["down"])
    fused = dict(x=both, weight=weight, bias=None, depth=2816, prologue=kernels.SWIGLU)
    yield "down + SwiGLU", 1024, 2816, fused, lambda w: gemv(swiglu(both[:, :2816], both[:, 2816:], "triton"), w)


if cli.fused:
    from linrnn.kernels.triton.gemv import _launch

    print()
    print("| product with its step | rows | BN | BK | warps | µs (median) | step + product µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rows in cli.rows:
        for name, _, depth, fused, unfused in fused_cases(rows):
            apart = timed(unfused, fused["weight"], cold=fused["weight"])
            results = [(timed(_launch, **fused, cold=fused["weight"]), "default", "", "")]
            for block_n, block_k, warps in LAUNCH_SHAPES:
                if block_k < fused.get("min_block_k", 1) or block_k > 2 * depth:
                    continue
                if 8 <= registers(rows, block_n, block_k, warps) <= 64:
                    us = timed(_launch, **fused, block_n=block_n, block_k=block_k, num_warps=warps,
                               cold=fused["weight"])  # fmt: skip
                    results.append((us, block_n, block_k, warps))
            for us, block_n, block_k, warps in [results[0], *sorted(results[1:])[:4]]:
                print(f"| {name} | {rows} | {block_n} | {block_k} | {warps} | {us:.1f} | {apart:.1f} |")

plain = cli.plain if cli.plain is not None else ([] if cli.fused else list(SHAPES))
if plain:
    print()
    print("| GEMM | rows | BN | BK | warps | µs (median) | GB/s | F.linear µs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
for name, rows in itertools.product(plain, cli.rows):
    columns, depth = SHAPES[name]
    x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(columns, depth, device="cuda", dtype=torch.bfloat16)
    cublas = timed(F.linear, x, weight, cold=weight)
    results = [(timed(gemv, x, weight, cold=weight), "default", "", "")]
    for block_n, block_k, warps in LAUNCH_SHAPES:
        if block_k > 2 * depth or not 8 <= registers(rows, block_n, block_k, warps) <= 64:
            continue
        us = timed(gemv, x, weight, block_n=block_n, block_k=block_k, num_warps=warps, cold=weight)
        results.append((us, block_n, block_k, warps))
    for us, block_n, block_k, warps in [results[0], *sorted(results[1:])[:3]]:
        rate = columns * depth * 2 / us / 1e3
        print(f"| {name} | {rows} | {block_n} | {block_k} | {warps} | {us:.1f} | {rate:.0f} | {cublas:.1f} |")
