"""How much GammaNet's d log Γ moves when the fold's operands (Γq, Γ⁻¹k) or their gradients are rounded, fp64 CPU.

ops.gammanet runs its chunkwise kernels on Γq and Γ⁻¹k rounded to the inputs' dtype and asks for their gradients in
fp32 (linrnn.kernels.library.fold), the choice these numbers led to; this measures the parts separately (the
relative error of d log Γ against the exact fp64 one): operands rounded to bf16 or tf32 with exact gradients, and
exact or rounded operands with bf16 or fp32 gradients of the folded inputs, d log Γ = Σ (Γq ⊙ d(Γq) − Γ⁻¹k ⊙
d(Γ⁻¹k)), with the products taken with the rounded operands (what the op does) or the unrounded ones.
Usage: python experiments/gammanet_fold_rounding.py
"""

import torch
import torch.nn.functional as F

from linrnn.kernels.chunked import recurrence_chunked

B, T, H, K, V = 1, 512, 2, 64, 64


def bf16(x):
    return x.to(torch.bfloat16).double()


def tf32(x):  # the mantissa rounded to 10 bits
    mantissa, exponent = torch.frexp(x)
    return torch.ldexp(torch.round(mantissa * 2**11) / 2**11, exponent)


def exact(x):
    return x


def main() -> None:
    torch.manual_seed(0)
    q, k, a = (bf16(F.normalize(torch.randn(B, T, H, K, dtype=torch.float64), dim=-1)) for _ in range(3))
    v = bf16(torch.randn(B, T, H, V, dtype=torch.float64))
    g = -torch.rand(B, T, H, K, dtype=torch.float64) * 0.1
    beta = torch.rand(B, T, H, dtype=torch.float64)
    log_gamma = 0.5 * torch.randn(H, K, dtype=torch.float64)
    do = torch.randn(B, T, H, V, dtype=torch.float64)

    def d_log_gamma(round_operands, round_grads, product="rounded"):
        gamma = log_gamma.exp()
        folded_q = round_operands(q * gamma).requires_grad_()
        folded_k = round_operands(k / gamma).requires_grad_()
        o, _ = recurrence_chunked(folded_q, folded_k, v, a, g, beta, scale=K**-0.5, chunk_size=64)
        dq, dk = (round_grads(d) for d in torch.autograd.grad((o * do).sum(), (folded_q, folded_k)))
        if product == "exact":  # the unrounded fold times gradients taken at the rounded point
            return ((q * gamma) * dq - (k / gamma) * dk).sum((0, 1))
        return (folded_q.detach() * dq - folded_k.detach() * dk).sum((0, 1))

    reference = d_log_gamma(exact, exact)
    for operands in (exact, tf32, bf16):
        for grads in (exact, bf16):
            for product in ("rounded", "exact") if operands is not exact else ("rounded",):
                error = (d_log_gamma(operands, grads, product) - reference).norm() / reference.norm()
                print(
                    f"operands {operands.__name__:5}  gradients {grads.__name__:5}  product with {product:7} "
                    f"operands  d log Γ relative error {error:.2e}"
                )


if __name__ == "__main__":
    main()
