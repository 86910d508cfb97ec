"""Launch-shape sweep of the fused recurrent kernel on the GPU (device time by triton.testing.do_bench, medians).

``python benchmarks/tune_fused_recurrent.py``: one decode step, H = 16, K = V = 128, bf16, per cell and batch.
``--heads 6 --value-dim 256 --batches 1 256 --steps 1 --in-place``: the 340M model's decoding step (the state
updated in place, as the engine does).
"""

import argparse
import itertools

import torch
import torch.nn.functional as F
from triton.testing import do_bench

from linrnn.kernels.triton.fused_recurrent import fused_recurrent_fwd

parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--key-dim", type=int, default=128)
parser.add_argument("--value-dim", type=int, default=128)
parser.add_argument("--batches", type=int, nargs="+", default=[1, 64])
parser.add_argument("--steps", type=int, nargs="+", default=[1, 64])
parser.add_argument("--in-place", action="store_true", help="write the final state into the initial state's buffer")
cli = parser.parse_args()
H, K, V = cli.heads, cli.key_dim, cli.value_dim


def inputs(batch, steps, decay):
    q, k, e = (F.normalize(torch.randn(batch, steps, H, K, device="cuda"), dim=-1).bfloat16() for _ in range(3))
    v = torch.randn(batch, steps, H, V, device="cuda").bfloat16()
    g = F.logsigmoid(torch.randn(batch, steps, H, *([K] if decay == "channel" else []), device="cuda") + 3)
    beta = torch.rand(batch, steps, H, device="cuda")
    state = torch.randn(batch, H, K, V, device="cuda")
    return (q, k, v, e, g, beta), state


print("| decay | batch | T | BV | warps | µs (median) |")
print("|---|---:|---:|---:|---:|---:|")
for decay, batch, steps in itertools.product(["head", "channel"], cli.batches, cli.steps):
    args, state = inputs(batch, steps, decay)
    for block_v, warps in itertools.product([16, 32, 64, 128], [1, 2, 4, 8]):

        def call(args=args, state=state, block_v=block_v, warps=warps):
            fused_recurrent_fwd(*args, scale=K**-0.5, initial_state=state, output_final_state=True,
                                final_state=state if cli.in_place else None, block_v=block_v,
                                num_warps=warps)  # fmt: skip

        ms = do_bench(call, warmup=25, rep=100, return_mode="median")
        print(f"| {decay} | {batch} | {steps} | {block_v} | {warps} | {ms * 1e3:.1f} |")
