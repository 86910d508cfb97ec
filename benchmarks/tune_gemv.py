"""Launch-shape sweep of the decoding matrix-vector kernel (``linrnn/kernels/triton/gemv.py``) on the GPU against
``F.linear`` (cuBLAS), at the 340M GDN's decoding GEMMs: device time per call inside a CUDA graph of 20 calls (as the
engine replays them: no host launch in the timing; median of 10 replays), and the weight bytes read per µs.

    python benchmarks/tune_gemv.py [--rows 1 8]
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
