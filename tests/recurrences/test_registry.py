import pytest
import torch

import linrnn
from linrnn.recurrences import ROLES

CELLS = ["deltanet", "gammanet", "gated_deltanet", "gdn2", "gla", "kda", "mamba2"]


def test_list_and_aliases():
    assert linrnn.list_cells() == CELLS
    assert linrnn.get_cell("gdn") is linrnn.get_cell("gated_deltanet")
    spec = linrnn.get_cell("gammanet")
    assert (spec.decay, spec.erase) == ("channel", "decoupled")
    assert (linrnn.get_cell("gla").decay, linrnn.get_cell("gla").erase) == ("channel", "off")
    assert linrnn.get_cell("gdn").roles["A_log"] == "gate_scalar"


def test_unknown_cell_lists_known():
    with pytest.raises(
        ValueError,
        match=r"unknown cell 'mamba'; known cells: deltanet, gammanet, gated_deltanet, gdn2, gla, kda, mamba2, gdn",
    ):
        linrnn.get_cell("mamba")
    with pytest.raises(ValueError, match="unknown cell 'mamba'"):
        linrnn.build_mixer("mamba", 64, 2)


@pytest.mark.parametrize("cell", CELLS)
def test_mixer_forward_backward_and_roles(cell):
    mixer = linrnn.build_mixer(cell, hidden_size=48, num_heads=3)
    x = torch.randn(2, 19, 48, requires_grad=True)
    y, state = mixer(x)
    assert y.shape == x.shape and state is None
    y.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    roles = linrnn.param_roles(mixer)
    assert set(roles) == {name for name, _ in mixer.named_parameters()}
    assert set(roles.values()) <= set(ROLES)
    for name, p in mixer.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
    _, state = mixer(x, output_state=True)
    assert state.recurrent.shape == (2, 3, mixer.head_k_dim, mixer.head_v_dim)
    assert state.recurrent.dtype == torch.float32 and state.position == 19


def test_cell_specific_roles():
    assert linrnn.param_roles(linrnn.build_mixer("gammanet", 32, 2))["log_gamma"] == "gamma"
    kda = linrnn.param_roles(linrnn.build_mixer("kda", 32, 2))
    assert kda["f_proj.0.weight"] == kda["f_proj.1.weight"] == "gate" and kda["dt_bias"] == "gate_scalar"
    assert linrnn.param_roles(linrnn.build_mixer("gla", 32, 2))["f_proj.1.bias"] == "bias"


def test_param_roles_refuses_unknown_parameters():
    mixer = linrnn.build_mixer("gdn", 32, 2)
    mixer.extra = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match=r"parameters without a role: \['extra'\]"):
        linrnn.param_roles(mixer)


def test_mixer_option_errors():
    with pytest.raises(
        ValueError, match=r"expand_k \* hidden_size = 37.5 must be an integer divisible by num_heads = 3"
    ):
        linrnn.build_mixer("kda", 50, 3)
    with pytest.raises(ValueError, match="extra_forbidden|Extra inputs"):
        linrnn.build_mixer("kda", 48, 3, expand_q=2)
    with pytest.raises(ValueError, match="num_heads"):
        linrnn.build_mixer("kda", 48, 0)


@pytest.mark.parametrize("cell", CELLS)
def test_op_inputs_in_range(cell, monkeypatch):
    """What a mixer hands its op: unit q, k (and a; Mamba-2's are not normalised), log-decay <= 0, beta in [0, 2]
    with negative eigenvalues on (Mamba-2's β is its step Δ ≥ 0), b in [0, 2], w in [0, 1]."""
    original = linrnn.ops.run
    seen = {}

    def spy(structure, op, q, k, v, inputs, options=None):
        seen.update(q=q, k=k, **inputs)
        return original(structure, op, q, k, v, inputs, options)

    monkeypatch.setattr(linrnn.ops, "run", spy)
    linrnn.build_mixer(cell, 32, 2, allow_neg_eigval=True)(10 * torch.randn(2, 9, 32))
    assert set(linrnn.get_cell(cell).structure.input_names()) <= set(seen)
    for name in ("q", "k", "a") if linrnn.get_cell(cell).mixer.normalize_keys else ("a",):
        if name in seen:
            torch.testing.assert_close(seen[name].norm(dim=-1), torch.ones(seen[name].shape[:-1]))
    if "g" in seen:
        assert (seen["g"] <= 0).all() and torch.isfinite(seen["g"]).all()
    for name, high in (("b", 2), ("w", 1)):
        if name in seen:
            assert (seen[name] >= 0).all() and (seen[name] <= high).all()
    if "beta" in seen and cell == "mamba2":
        assert (seen["beta"] >= 0).all()
    elif "beta" in seen:
        assert (seen["beta"] >= 0).all() and (seen["beta"] <= 2).all() and seen["beta"].max() > 1
