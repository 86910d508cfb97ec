"""Launch-shape sweep of the fused recurrent kernel on the GPU (device time by triton.testing.do_bench, medians).

``python benchmarks/tune_fused_recurrent.py``: one decode step, H = 16, K = V = 128, bf16, per cell and batch.
"""

import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from linrnn.kernels.triton.fused_recurrent import fused_recurrent_fwd

H, K, V = 16, 128, 128


def inputs(batch, steps, decay):
    q, k, e = (F.normalize(torch.randn(batch, steps, H, K, device="cuda"), dim=-1).bfloat16() for _ in range(3))
    v = torch.randn(batch, steps, H, V, device="cuda").bfloat16()
    g = F.logsigmoid(torch.randn(batch, steps, H, *([K] if decay == "channel" else []), device="cuda") + 3)
    beta = torch.rand(batch, steps, H, device="cuda")
    state = torch.randn(batch, H, K, V, device="cuda")
    return (q, k, v, e, g, beta), state


print("| decay | batch | T | BV | warps | µs (median) |")
print("|---|---:|---:|---:|---:|---:|")
for decay, batch, steps in itertools.product(["head", "channel"], [1, 64], [1, 64]):
    args, state = inputs(batch, steps, decay)
    for block_v, warps in itertools.product([16, 32, 64, 128], [1, 2, 4, 8]):

        def call(args=args, state=state, block_v=block_v, warps=warps):
            fused_recurrent_fwd(*args, scale=K**-0.5, initial_state=state, output_final_state=True,
                                block_v=block_v, num_warps=warps)  # fmt: skip

        ms = do_bench(call, warmup=25, rep=100, return_mode="median")
        print(f"| {decay} | {batch} | {steps} | {block_v} | {warps} | {ms * 1e3:.1f} |")
