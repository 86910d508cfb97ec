"""Gated DeltaNet-2 against FLA's reference and Mamba-2 against an independent SSD, in fp64 on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import linrnn
from linrnn import ops
from tests.helpers import assert_close, forward_backward, make_inputs


def fla_gdn2_reference():
    """FLA's ``naive_recurrent_gdn2``, loaded from its file (importing the ``fla`` package takes ~10 s)."""
    spec = importlib.util.find_spec("fla")
    if spec is None:
        pytest.skip("flash-linear-attention (fla-core) is not installed")
    path = Path(spec.origin).parent / "ops" / "gdn2" / "naive.py"
    module_spec = importlib.util.spec_from_file_location("fla_gdn2_naive", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module.naive_recurrent_gdn2


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("initial_state", [False, True])
def test_gdn2_matches_fla_reference(backend, initial_state):
    """FLA's loop computes in fp32 (it casts its inputs), so the bar is fp32's; outputs, final state and every
    gradient."""
    naive = fla_gdn2_reference()
    inputs = make_inputs("gdn2", B=2, T=37, H=3, K=8, V=6, initial_state=initial_state, seed=4)
    ours = forward_backward("gdn2", inputs, backend=backend, chunk_size=16 if backend == "torch" else None)

    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    o, final = naive(**{name: leaves[name] for name in ("q", "k", "v", "g", "b", "w")},
                     initial_state=leaves.get("initial_state"), output_final_state=True)  # fmt: skip
    gen = torch.Generator().manual_seed(1)  # forward_backward's cotangents
    d_o = torch.randn(o.shape, generator=gen, dtype=torch.float64)
    d_final = torch.randn(final.shape, generator=gen, dtype=torch.float64)
    (o.double() * d_o).sum().add((final.double() * d_final).sum()).backward()

    assert_close(ours[0], o.detach().double(), 1e-5, "output")
    assert_close(ours[1], final.detach().double(), 1e-5, "final state")
    for name, x in leaves.items():
        assert_close(ours[2][name], x.grad, 1e-5, f"grad of {name}")


def test_gdn2_with_scalar_gates_is_kda():
    inputs = make_inputs("kda", B=1, T=20, H=2, K=8, V=4, seed=2)
    beta = inputs.pop("beta")
    expected, _ = ops.kda(**inputs, beta=beta, backend="reference")
    b, w = beta[..., None].expand(-1, -1, -1, 8), beta[..., None].expand(-1, -1, -1, 4)
    actual, _ = ops.gdn2(**inputs, b=b, w=w, backend="reference")
    assert_close(actual, expected, 1e-12, "output")


def ssd_loop(C, B, x, dt, A, initial_state=None):
    """Mamba-2's recurrence, written from its definition: h_t = exp(Δ_t A) h_{t−1} + Δ_t B_t x_tᵀ, y_t = h_tᵀ C_t.
    C, B ``[b, T, H, N]``, x ``[b, T, H, P]``, dt ``[b, T, H]``, A ``[H]`` (negative)."""
    batch, steps, heads, size = B.shape
    h = torch.zeros(batch, heads, size, x.shape[-1], dtype=x.dtype) if initial_state is None else initial_state
    ys = []
    for t in range(steps):
        decay = torch.exp(dt[:, t] * A)[..., None, None]
        h = decay * h + dt[:, t, :, None, None] * B[:, t, ..., None] * x[:, t, :, None]
        ys.append(torch.einsum("bhn,bhnp->bhp", C[:, t], h))
    return torch.stack(ys, dim=1), h


def ssd_quadratic(C, B, x, dt, A):
    """The same map in SSD's dual (attention-like) form: Y = (L ∘ C Bᵀ) X per head, with
    ``L[t, s] = exp(Σ_{s<r≤t} Δ_r A) Δ_s`` for s ≤ t, else 0."""
    cumulative = torch.cumsum(dt * A, dim=1)  # [b, T, H]
    exponent = cumulative[:, :, None] - cumulative[:, None, :]  # [b, t, s, H]
    causal = torch.ones(C.shape[1], C.shape[1], dtype=torch.bool).tril()[None, :, :, None]
    L = torch.where(causal, exponent, float("-inf")).exp() * dt[:, None, :, :]
    scores = torch.einsum("bthn,bshn->btsh", C, B) * L
    return torch.einsum("btsh,bshp->bthp", scores, x)


@pytest.mark.parametrize("backend", ["reference", "torch"])
def test_ssd_op_matches_mamba2_recurrence(backend):
    gen = torch.Generator().manual_seed(3)
    b, T, H, N, P = 2, 45, 3, 8, 5
    C, B = (torch.randn(b, T, H, N, generator=gen, dtype=torch.float64) for _ in range(2))
    x = torch.randn(b, T, H, P, generator=gen, dtype=torch.float64)
    dt = F.softplus(torch.randn(b, T, H, generator=gen, dtype=torch.float64))
    A = -torch.rand(H, generator=gen, dtype=torch.float64) * 4
    state = torch.randn(b, H, N, P, generator=gen, dtype=torch.float64)

    y, final = ops.ssd(C, B, x, dt * A, dt, scale=1.0, initial_state=state, output_final_state=True, backend=backend,
                       chunk_size=16 if backend == "torch" else None)  # fmt: skip
    y_loop, final_loop = ssd_loop(C, B, x, dt, A, state)
    assert_close(y, y_loop, 1e-12, "output")
    assert_close(final, final_loop, 1e-12, "final state")
    y0, _ = ops.ssd(C, B, x, dt * A, dt, scale=1.0, backend=backend, chunk_size=16 if backend == "torch" else None)
    assert_close(y0, ssd_quadratic(C, B, x, dt, A), 1e-12, "output (dual form)")


def test_mamba2_mixer_adds_the_skip_and_reads_unnormalised_keys():
    """The layer: SSD with Δ from the softplus step, C = q and B = k not normalised, query scale 1, plus D·x."""
    torch.manual_seed(0)
    mixer = linrnn.build_mixer("mamba2", 16, 2, backend="reference").double()
    with torch.no_grad():
        mixer.D.copy_(torch.tensor([0.5, -2.0]))
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    probes = {}
    mixer.probes = probes
    mixer(x)
    projected = mixer.project(x)
    C, B, v, _, _ = mixer.streams(projected)
    step = F.softplus(projected["dt"] + mixer.dt_bias)
    y, _ = ssd_loop(C, B, v, step, -mixer.A_log.exp())
    assert_close(probes["q"], C, 0, "q (not normalised)")
    assert (B.norm(dim=-1) - 1).abs().max() > 0.1  # B is not L2-normed
    assert_close(probes["o"], y + mixer.D[:, None] * v, 1e-12, "recurrence output plus D·x")
