"""A cell written in this file only, through ``linrnn.register_cell``: every part of linrnn takes it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import linrnn
from linrnn import parametrizations, stability
from linrnn.parametrizations.coord_check import coord_check
from linrnn.training import names


class SigmoidGatedDeltaNet(linrnn.LinearRNNMixer):
    """Gated DeltaNet with a sigmoid decay gate: ``g = logsigmoid(W_α x + bias) / 8`` per head."""

    gate_inputs = ("f", "b")

    def __init__(self, config: linrnn.MixerConfig):
        super().__init__(config)
        self.f_proj = nn.Linear(config.hidden_size, config.num_heads, bias=True)
        self.b_proj = nn.Linear(config.hidden_size, config.num_heads, bias=False)

    def gates(self, projected, k, extra):
        return {"g": F.logsigmoid(projected["f"].float()) / 8, "beta": self.write_strength(projected["b"])}


@pytest.fixture
def cell():
    spec = linrnn.register_cell(
        linrnn.CellSpec(
            name="sigmoid_gdn",
            mixer=SigmoidGatedDeltaNet,
            structure=linrnn.Structure(decay="head", erase="tied"),
            cell_roles={"f_proj.weight": "gate", "f_proj.bias": "bias", "b_proj.weight": "gate"},
            aliases=("sgdn",),
        )
    )
    yield spec.name
    linrnn.unregister_cell(spec.name)
    assert "sigmoid_gdn" not in linrnn.list_cells()


def test_a_registered_cell_works_everywhere(cell):
    assert cell in linrnn.list_cells() and linrnn.get_cell("sgdn").name == cell
    assert "sgdn_tiny_sp" in names.config_names()  # training config names come from the registry

    # a model, and one training step through its parametrization's optimizer groups
    torch.manual_seed(0)
    model = linrnn.build_model("sgdn", num_layers=2)
    roles = linrnn.param_roles(model)
    assert roles["layers.0.mixer.f_proj.bias"] == "bias" and roles["layers.1.mixer.b_proj.weight"] == "gate"
    applied = parametrizations.apply(model, "mup", base_width=32)
    optimizer = torch.optim.AdamW(applied.param_groups(lr=1e-2))
    ids = torch.randint(0, 256, (2, 33))
    losses = []
    for _ in range(2):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[1] < losses[0]

    # the stability checker reads the transition and the certificate from the structure
    report = stability.check(cell, draws=64, restarts=2, steps=10, key_dim=4)
    assert report.passed and report.bound == "‖A‖₂ ≤ 1"
    layers = stability.check_model(model, ids)
    assert [layer.cell for layer in layers] == [cell, cell] and all(layer.passed for layer in layers)

    # the coordinate check runs it at two widths
    result = coord_check(cell, "mup", widths=(32, 64), base_width=32, steps=1, batch=2, seq_len=16)
    assert {"layers.1.mixer.f_proj", "layers.1.mixer:o", "layers.1.mixer:decay"} <= set(result.sizes)
    assert all(torch.isfinite(torch.as_tensor(sizes)).all() for sizes in result.sizes.values())

    # the op's checks name the argument, the expected and the actual
    op = linrnn.get_cell(cell).op
    q = F.normalize(torch.randn(1, 5, 2, 4), dim=-1)
    with pytest.raises(ValueError, match=r"cell 'sigmoid_gdn': argument 'g' must have shape \[B, T, H\]"):
        op(q, q, torch.randn(1, 5, 2, 3), g=torch.zeros(1, 5, 2, 4), beta=torch.rand(1, 5, 2))
    with pytest.raises(ValueError, match=r"cell 'sigmoid_gdn': argument 'beta' \(.*\) is required, got None"):
        op(q, q, torch.randn(1, 5, 2, 3), g=torch.zeros(1, 5, 2), beta=None)


def test_registering_refuses_a_taken_name_and_an_unknown_role(cell):
    spec = linrnn.get_cell(cell)
    with pytest.raises(linrnn.errors.UsageError, match=r"name 'sigmoid_gdn' is taken"):
        linrnn.register_cell(spec)
    with pytest.raises(linrnn.errors.UsageError, match=r"unknown roles \['weights'\]"):
        linrnn.register_cell(linrnn.CellSpec(name="other", mixer=SigmoidGatedDeltaNet, structure=spec.structure,
                                             cell_roles={"f_proj.weight": "weights"}))  # fmt: skip
    with pytest.raises(ValueError, match=r"erase_gate='channel' needs an erase, got erase='off'"):
        linrnn.Structure(decay="head", erase="off", erase_gate="channel")
    with pytest.raises(ValueError, match=r"argument 'decay' must be one of \['none', 'head', 'channel'\], got 'row'"):
        linrnn.Structure(decay="row")
