"""Measures of transition operators ``A`` ``[..., K, K]`` and of their products over time.

Growth over a sequence ``A_1 … A_T`` (``[..., T, K, K]``) is ``‖A_t ⋯ A_1‖₂`` for every t, from a running
product rescaled at each step (its log-scale accumulated), so it neither overflows nor underflows at long
horizons. The Lyapunov exponents come from the QR iteration (Benettin et al.): ``Q_t R_t = A_t Q_{t−1}``,
``λ_i ≈ (1/T) Σ_t log |R_t[i, i]|``, starting from a random orthogonal ``Q_0``; ``λ_1`` (the first column) is the
top exponent, the rate at which a generic vector grows, and equals ``log ρ(A)`` for a repeated ``A``.
"""

from __future__ import annotations

import torch
from torch import Tensor

TINY = 1e-300  # floor under norms and |R_ii| before a log: a zero product gives a very negative log, not NaN


def spectral_radius(A: Tensor) -> Tensor:
    """``max |eig(A)|`` ``[...]``."""
    return torch.linalg.eigvals(A).abs().amax(-1)


def operator_norm(A: Tensor) -> Tensor:
    """``‖A‖₂`` (largest singular value) ``[...]``."""
    return torch.linalg.matrix_norm(A, ord=2)


def natural_norm(A: Tensor, metric: Tensor | None) -> Tensor:
    """``‖M⁻¹ A M‖₂``: the operator norm induced by ``‖x‖_M = ‖M⁻¹ x‖₂`` (``metric`` M; None: Euclidean)."""
    if metric is None:
        return operator_norm(A)
    return operator_norm(torch.linalg.solve(metric, A @ metric))


def condition_number(metric: Tensor | None, like: Tensor) -> Tensor:
    """``cond₂(M)`` ``[...]`` (1 for None, shaped like ``like[..., 0, 0]``)."""
    if metric is None:
        return torch.ones_like(like[..., 0, 0])
    return torch.linalg.cond(metric)


def log_growth(As: Tensor) -> Tensor:
    """``log ‖A_t ⋯ A_1‖₂`` for t = 1 … T, ``[..., T]``, from ``As`` ``[..., T, K, K]``; differentiable."""
    product = torch.eye(As.shape[-1], dtype=As.dtype, device=As.device).expand(As.shape[:-3] + As.shape[-2:])
    log_scale = torch.zeros(As.shape[:-3], dtype=As.dtype, device=As.device)
    logs = []
    for t in range(As.shape[-3]):
        product = As[..., t, :, :] @ product
        norm = torch.linalg.matrix_norm(product, ord=2).clamp_min(TINY)
        log_scale = log_scale + norm.log()
        logs.append(log_scale)
        product = product / norm[..., None, None]
    return torch.stack(logs, dim=-1)


def lyapunov_exponents(As: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """Lyapunov exponent estimates ``[..., K]`` of the sequence ``As`` ``[..., T, K, K]`` (QR iteration); the
    first entry is the top exponent."""
    size, steps = As.shape[-1], As.shape[-3]
    start = torch.randn(As.shape[:-3] + (size, size), generator=generator, dtype=As.dtype).to(As.device)
    basis = torch.linalg.qr(start).Q
    total = torch.zeros(As.shape[:-3] + (size,), dtype=As.dtype, device=As.device)
    for t in range(steps):
        basis, upper = torch.linalg.qr(As[..., t, :, :] @ basis)
        total = total + upper.diagonal(dim1=-2, dim2=-1).abs().clamp_min(TINY).log()
    return total / steps


def log_spectral_radius_surrogate(A: Tensor, squarings: int = 6) -> Tensor:
    """``log ‖A^(2^s)‖₂ / 2^s`` ``[...]``, an upper estimate of ``log ρ(A)`` that tends to it as s grows and,
    unlike ``eigvals``, has a smooth gradient (used by the adversarial search)."""
    norm = torch.linalg.matrix_norm(A, ord=2).clamp_min(TINY)
    log_norm, power = norm.log(), A / norm[..., None, None]
    for _ in range(squarings):
        power = power @ power
        norm = torch.linalg.matrix_norm(power, ord=2).clamp_min(TINY)
        log_norm, power = 2 * log_norm + norm.log(), power / norm[..., None, None]
    return log_norm / 2**squarings
