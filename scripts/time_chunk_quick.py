"""Quick GPU timing of the Triton chunkwise ops alone (no FLA, no autotuning wait): every cell, forward and
forward+backward at B = 8, T = 4096, H = 16, K = V = 128, bf16, median of ``triton.testing.do_bench``, and the
peak memory of one forward+backward. The same-run comparison against FLA is benchmarks/test_chunk_gpu.py.

Run on the device with the carried wheels on PYTHONPATH: ``python3 scripts/time_chunk_quick.py``.
"""

import torch
import torch.nn.functional as F
import triton

from linrnn import ops

B, T, H, K, V = 8, 4096, 16, 128, 128


def main():
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    q = torch.randn(B, T, H, K, **bf16)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).bfloat16()
    a = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).bfloat16()
    v = torch.randn(B, T, H, V, **bf16)
    g_head = F.logsigmoid(torch.randn(B, T, H, device="cuda") + 3)
    g_chan = F.logsigmoid(torch.randn(B, T, H, K, device="cuda") + 3)
    beta = torch.rand(B, T, H, device="cuda").sigmoid()
    log_gamma = 0.1 * torch.randn(H, K, device="cuda")
    leaves = [x.requires_grad_() for x in (q, k, a, v, g_head, g_chan, beta, log_gamma)]
    d_o = torch.randn(B, T, H, V, **bf16)
    cells = {
        "gla": lambda: ops.gla(q, k, v, g_chan, backend="triton"),
        "deltanet": lambda: ops.delta_rule(q, k, v, beta, backend="triton"),
        "gated_deltanet": lambda: ops.gated_delta_rule(q, k, v, g_head, beta, backend="triton"),
        "kda": lambda: ops.kda(q, k, v, g_chan, beta, backend="triton"),
        "gammanet": lambda: ops.gammanet(q, k, v, a, g_chan, beta, log_gamma, backend="triton"),
    }
    for name, forward in cells.items():

        def forward_backward(forward=forward):
            forward()[0].backward(d_o)

        fwd = triton.testing.do_bench(forward, return_mode="median")
        fwd_bwd = triton.testing.do_bench(forward_backward, return_mode="median", grad_to_none=leaves)
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        forward_backward()
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        print(f"{name:15s} fwd {fwd:.3f} ms  fwd+bwd {fwd_bwd:.3f} ms  peak {peak:.0f} MiB", flush=True)


if __name__ == "__main__":
    main()
