"""Which kernel of the fused path (DeltaNet, GDN) goes wrong on the GPU: T from the solve against T formed in fp64
from k and β, then o and the final state (the state pass from T and the output kernel) against the torch backend.
Run on the device::

    python3 experiments/diag_fused_path.py
"""

import torch
import torch.nn.functional as F

from linrnn import ops
from linrnn.kernels.triton import chunk


def reference_t(k, beta, G):
    """``(I + Diag(β) A_kk)⁻¹`` per 64-step chunk in fp64, ``[T, H, 64]`` (T a multiple of 64 here)."""
    _, steps, heads, _ = k.shape
    out = torch.zeros(steps, heads, 64, dtype=torch.float64, device=k.device)
    for start in range(0, steps, 64):
        kc = k[0, start : start + 64].double()  # [64, H, K]
        n = kc.shape[0]
        for h in range(heads):
            a = kc[:, h] @ kc[:, h].T
            if G is not None:
                g = G[0, start : start + n, h].double()
                a = a * torch.exp(g[:, None] - g[None, :]).tril()
            a = torch.tril(a, -1) * beta[0, start : start + n, h].double()[:, None]
            out[start : start + n, h, :n] = torch.linalg.inv(torch.eye(n, dtype=torch.float64, device=k.device) + a)
    return out


def main():
    torch.manual_seed(0)
    B, T, H, K = 1, 128, 4, 64
    dev = dict(device="cuda")
    q = torch.randn(B, T, H, K, **dev).bfloat16()
    k = F.normalize(torch.randn(B, T, H, K, **dev), dim=-1).bfloat16()
    v = torch.randn(B, T, H, K, **dev).bfloat16()
    beta = torch.rand(B, T, H, **dev)
    g = F.logsigmoid(torch.randn(B, T, H, **dev) + 3)
    for name, gate in (("deltanet", None), ("gated_deltanet", g)):
        o, final, saved = chunk.chunk_forward(q, k, None, v, gate, beta, erase=True, scale=K**-0.5,
                                              initial_state=None, output_final_state=True, cu_seqlens=None)  # fmt: skip
        G = None if gate is None else saved["G"].view(B, T, H)
        t_err = (saved["T"].double() - reference_t(k, beta, G)).abs().max().item()
        args = (q, k, v) + ((beta,) if gate is None else (gate, beta))
        op = ops.delta_rule if gate is None else ops.gated_delta_rule
        o_ref, final_ref = op(*(x.float() for x in args), backend="torch", output_final_state=True)
        o_err = ((o.float() - o_ref).norm() / o_ref.norm()).item()
        s_err = ((final - final_ref).norm() / final_ref.norm()).item()
        print(f"{name:15s}: T max abs err {t_err:.2e}, o rel {o_err:.2e}, final rel {s_err:.2e}")
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
