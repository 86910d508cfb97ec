import torch, triton, torch.nn.functional as F, sys
from linrnn import ops
torch.manual_seed(0)
B, T, H, K, V = 8, 4096, 16, 128, 128
dev = "cuda"
q = torch.randn(B, T, H, K, device=dev, dtype=torch.bfloat16, requires_grad=True)
k = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16().requires_grad_()
a = F.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).bfloat16().requires_grad_()
v = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16, requires_grad=True)
gh = F.logsigmoid(torch.randn(B, T, H, device=dev) + 3).requires_grad_()
gc = F.logsigmoid(torch.randn(B, T, H, K, device=dev) + 3).requires_grad_()
beta = torch.rand(B, T, H, device=dev).sigmoid().requires_grad_()
lg = (0.1 * torch.randn(H, K, device=dev)).requires_grad_()
do = torch.randn(B, T, H, V, device=dev, dtype=torch.bfloat16)
calls = {
 "gla": lambda: ops.gla(q, k, v, gc, backend="triton"),
 "deltanet": lambda: ops.delta_rule(q, k, v, beta, backend="triton"),
 "gdn": lambda: ops.gated_delta_rule(q, k, v, gh, beta, backend="triton"),
 "kda": lambda: ops.kda(q, k, v, gc, beta, backend="triton"),
 "gammanet": lambda: ops.gammanet(q, k, v, a, gc, beta, lg, backend="triton"),
}
for name, fn in calls.items():
    fwd = triton.testing.do_bench(lambda: fn(), return_mode="median")
    def fb():
        o, _ = fn(); o.backward(do)
    fwdbwd = triton.testing.do_bench(fb, return_mode="median", grad_to_none=[q, k, a, v, gh, gc, beta, lg])
    torch.cuda.reset_peak_memory_stats(); base = torch.cuda.memory_allocated(); fb(); peak = (torch.cuda.max_memory_allocated() - base) / 2**20
    print(f"{name:9s} fwd {fwd:.3f} ms  fwd+bwd {fwdbwd:.3f} ms  peak {peak:.0f} MiB", flush=True)
