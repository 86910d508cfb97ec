"""Identities between cells (KDA with a channel-constant gate is GDN, GDN without decay is DeltaNet, GammaNet with
Γ = I and a tied erase is KDA, ...), each on both backends."""

import pytest
import torch

from linrnn import ops
from tests.helpers import assert_close, make_inputs


def assert_same_result(actual, expected, rtol):
    """(output, final state) pairs agree."""
    assert_close(actual[0], expected[0], rtol, "output")
    assert_close(actual[1], expected[1], rtol, "final state")


BACKENDS = ["reference", "torch"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_kda_with_channel_constant_gate_is_gdn(backend):
    x = make_inputs("gated_deltanet", B=2, T=70, H=3, K=20, V=12, initial_state=True, seed=1)
    o_gdn, s_gdn = ops.gated_delta_rule(**x, output_final_state=True, backend=backend)
    x["g"] = x["g"][..., None].expand(-1, -1, -1, 20)
    o_kda, s_kda = ops.kda(**x, output_final_state=True, backend=backend)
    assert_same_result((o_kda, s_kda), (o_gdn, s_gdn), 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gdn_with_zero_decay_is_deltanet(backend):
    x = make_inputs("deltanet", B=2, T=70, H=3, K=20, V=12, initial_state=True, seed=2)
    o_delta, s_delta = ops.delta_rule(**x, output_final_state=True, backend=backend)
    o_gdn, s_gdn = ops.gated_delta_rule(
        **x, g=torch.zeros(2, 70, 3, dtype=torch.float64), output_final_state=True, backend=backend
    )
    assert_same_result((o_gdn, s_gdn), (o_delta, s_delta), 1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gammanet_with_identity_gamma_and_tied_erase_is_kda(backend):
    x = make_inputs("kda", B=2, T=70, H=3, K=20, V=12, initial_state=True, seed=3)
    o_kda, s_kda = ops.kda(**x, output_final_state=True, backend=backend)
    o_gn, s_gn = ops.gammanet(
        **x, a=x["k"], log_gamma=torch.zeros(3, 20, dtype=torch.float64), output_final_state=True, backend=backend
    )
    assert_same_result((o_gn, s_gn), (o_kda, s_kda), 1e-12)


def unfolded_gammanet(q, k, v, a, g, beta, log_gamma, initial_state):
    """GammaNet exactly as specified, no fold: S_t = (I − β Γ a aᵀ Γ⁻¹) Diag(exp g) S_{t−1} + β k vᵀ."""
    gamma = log_gamma.exp()  # [H, K]
    state = initial_state.clone()
    outputs = []
    for t in range(q.shape[1]):
        state = g[:, t].exp()[..., None] * state
        left, right = gamma * a[:, t], a[:, t] / gamma  # Γ a, Γ⁻¹ a: [B, H, K]
        state = (
            state
            - beta[:, t, :, None, None] * left[..., None] * torch.einsum("bhk,bhkv->bhv", right, state)[:, :, None]
        )
        state = state + beta[:, t, :, None, None] * k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * q.shape[-1] ** -0.5, state))
    return torch.stack(outputs, dim=1), state


@pytest.mark.parametrize("backend", BACKENDS)
def test_fold_identity(backend):
    """ops.gammanet (computed on Γ⁻¹S with e = a, w = Γ⁻¹k, query Γq) equals the unfolded definition."""
    x = make_inputs("gammanet", B=2, T=70, H=3, K=20, V=12, initial_state=True, seed=4)
    x["log_gamma"] = 1.5 * torch.randn(3, 20, dtype=torch.float64)  # cond(Γ) far from 1
    expected_o, expected_s = unfolded_gammanet(**x)
    o, s = ops.gammanet(**x, output_final_state=True, backend=backend)
    assert_same_result((o, s), (expected_o, expected_s), 1e-10)


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_cell_ops_are_cases_of_recurrence(backend):
    x = make_inputs("kda", B=1, T=50, H=2, K=16, V=8, initial_state=True, seed=5)
    expected = ops.kda(**x, output_final_state=True, backend=backend)
    actual = ops.recurrence(**x, e=x["k"].clone(), output_final_state=True, backend=backend)
    assert_same_result(actual, expected, 1e-12)
    gla = make_inputs("gla", B=1, T=50, H=2, K=16, V=8, seed=6)
    expected = ops.gla(**gla, output_final_state=True, backend=backend)
    actual = ops.recurrence(**gla, erase=False, output_final_state=True, backend=backend)
    assert_same_result(actual, expected, 1e-12)


def test_split_sequence_with_carried_state_equals_whole():
    """Running T steps = running the first part, then the rest from its final state (what decoding relies on)."""
    x = make_inputs("gammanet", B=2, T=90, H=2, K=16, V=8, initial_state=True, seed=7)
    whole_o, whole_s = ops.gammanet(**x, output_final_state=True)
    first = {n: t[:, :37] if t.dim() >= 3 and n != "initial_state" else t for n, t in x.items()}
    rest = {n: t[:, 37:] if t.dim() >= 3 and n != "initial_state" else t for n, t in x.items()}
    o1, s1 = ops.gammanet(**first, output_final_state=True)
    o2, s2 = ops.gammanet(**{**rest, "initial_state": s1}, output_final_state=True)
    assert_same_result((torch.cat([o1, o2], dim=1), s2), (whole_o, whole_s), 1e-12)
