"""Launch-shape sweep of the decoding matrix-vector kernel (``linrnn/kernels/triton/gemv.py``) on the GPU against
``F.linear`` (cuBLAS), at the 340M GDN's decoding GEMMs: device time per call inside a CUDA graph of 20 calls (as the
engine replays them: no host launch in the timing; median of 10 replays), and the weight bytes read per µs.
``--fused``: each product with the elementwise step before it in the kernel's prologue (add + RMSNorm, gated RMSNorm,
SwiGLU) against that step's own kernel followed by the plain product.

    python benchmarks/tune_gemv.py [--rows 1 8] [--fused]
"""

import argparse
import itertools

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
cli = parser.parse_args()
print("| GEMM | rows | BN | BK | warps | µs (median) | GB/s | F.linear µs |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")


def timed(fn, *args, calls: int = 20, replays: int = 10, **kwargs) -> float:
    """Median µs of one ``fn(*args, **kwargs)`` inside a CUDA graph of ``calls`` calls."""
    fn(*args, **kwargs)  # compile
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn(*args, **kwargs)
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
        yield name + " + add, RMSNorm", columns, depth, fused, lambda w=weight: gemv(
            rms_norm(x, norm, 1e-6, delta, "triton")[0], w)
    o, z, head_norm, weight = bf16(rows, 1, 6, 256), bf16(rows, 1, 6, 256), bf16(256), bf16(*SHAPES["o_proj"])
    fused = dict(x=o.view(rows, -1), weight=weight, bias=None, depth=1536, prologue=kernels.GATED_RMS_NORM,
                 aux=z.view(rows, -1), norm_weight=head_norm, eps=1e-6, group=256, min_block_k=256)  # fmt: skip
    yield "o_proj + gated RMSNorm", 1024, 1536, fused, lambda: gemv(
        gated_rms_norm(o, z, head_norm, 1e-6, "triton").view(rows, -1), weight)
    both, weight = bf16(rows, 5632), bf16(*SHAPES["down"])
    fused = dict(x=both, weight=weight, bias=None, depth=2816, prologue=kernels.SWIGLU)
    yield "down + SwiGLU", 1024, 2816, fused, lambda: gemv(swiglu(both[:, :2816], both[:, 2816:], "triton"), weight)


if cli.fused:
    from linrnn.kernels.triton.gemv import _launch

    print()
    print("| product with its step | rows | BN | BK | warps | µs (median) | step + product µs |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for rows in cli.rows:
        for name, columns, depth, fused, unfused in fused_cases(rows):
            apart = timed(unfused)
            results = [(timed(_launch, **fused), "default", "", "")]
            for block_n, block_k in itertools.product([2, 4, 8, 16], [256, 512, 1024, 2048]):
                if block_k < fused.get("min_block_k", 1) or block_k > 2 * depth:
                    continue
                for warps in (1, 2, 4, 8):
                    per_thread = rows * block_n * block_k / (32 * warps)  # accumulator registers
                    if 16 <= per_thread <= 64:
                        us = timed(_launch, **fused, block_n=block_n, block_k=block_k, num_warps=warps)
                        results.append((us, block_n, block_k, warps))
            for us, block_n, block_k, warps in [results[0], *sorted(results[1:])[:4]]:
                print(f"| {name} | {rows} | {block_n} | {block_k} | {warps} | {us:.1f} | {apart:.1f} |")
    raise SystemExit(0)

for (name, (columns, depth)), rows in itertools.product(SHAPES.items(), cli.rows):
    x = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    weight = torch.randn(columns, depth, device="cuda", dtype=torch.bfloat16)
    cublas = timed(F.linear, x, weight)
    results = [(timed(gemv, x, weight), "default", "", "")]
    for block_n, block_k, warps in [(16, 256, 4), *itertools.product([1, 2, 4], [512, 1024, 2048], [1, 2, 4])]:
        if block_n * block_k * rows > 16384 or block_k > 2 * depth:
            continue
        us = timed(gemv, x, weight, block_n=block_n, block_k=block_k, num_warps=warps)
        results.append((us, block_n, block_k, warps))
    for us, block_n, block_k, warps in [results[0], *sorted(results[1:])[:3]]:
        rate = columns * depth * 2 / us / 1e3
        print(f"| {name} | {rows} | {block_n} | {block_k} | {warps} | {us:.1f} | {rate:.0f} | {cublas:.1f} |")
