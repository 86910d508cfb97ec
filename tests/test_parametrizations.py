"""linrnn.parametrizations: the registry, the per-role rules (the GDN-muP paper's SGD gate rules among them), the
base-width equivalence with SP, param_groups, and the coordinate check: flat under muP and GDN-muP, growing under
SP."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import linrnn
from linrnn import parametrizations as P
from linrnn.parametrizations.coord_check import coord_check
from tests.helpers import CELLS

GATES = {"f_proj.weight", "b_proj.weight"}  # GDN's W_α, W_β
SCALARS = {"A_log", "dt_bias"}


def test_registry():
    assert P.list_parametrizations() == ["gdn-mup", "mup", "sp"]
    with pytest.raises(ValueError, match="unknown parametrization 'ntk'"):
        P.get("ntk")


def test_register_a_parametrization(monkeypatch):
    """A user's parametrization (here: muP with a fixed embedding lr under SGD) is found by name by ``apply``."""
    monkeypatch.setattr(P, "_REGISTRY", dict(P._REGISTRY))

    class FixedEmbeddingLr(P.MuP):
        name = "mup-fixed-embedding"

        def rule(self, role, shape, m, optimizer):
            rule = super().rule(role, shape, m, optimizer)
            return P.Rule(init_scale=rule.init_scale, lr=1.0) if role == "embedding" else rule

    P.register(FixedEmbeddingLr())
    P.register(FixedEmbeddingLr())  # the same class again: a re-imported script
    assert "mup-fixed-embedding" in P.list_parametrizations()
    lrs = P.apply(linrnn.build_model("gdn", hidden_size=256), "mup-fixed-embedding", base_width=64, optimizer="sgd")
    assert lrs.lr_multipliers()["embed.weight"] == 1.0  # muP's would be m_out = 4
    assert lrs.lr_multipliers()["norm.weight"] == pytest.approx(4.0)  # the other roles keep muP's rules
    with pytest.raises(ValueError, match="the name 'mup' is taken by MuP"):
        P.register(type("Other", (P.MuP,), {})())
    with pytest.raises(ValueError, match="expected a Parametrization with a name"):
        P.register(type("Nameless", (P.Parametrization,), {})())


def gdn_lrs(name, optimizer, width, base_width=64):
    model = linrnn.build_model("gdn", hidden_size=width)
    applied = P.apply(model, name, base_width=base_width, optimizer=optimizer)
    return {n.split("mixer.")[-1]: lr for n, lr in applied.lr_multipliers().items() if "layers.0." in n}


@pytest.mark.parametrize("m", [4, 16])
def test_seed_sgd_gate_rules(m):
    """Under gdn-mup SGD, W_α and W_β scale as m^-1/2 and A_log, dt_bias as m^1/2; plain muP treats W_α, W_β as
    hidden (lr · 1) and A_log, dt_bias as fixed-size biases (lr · 1); under AdamW both give the gates η/m."""
    gdn_sgd, mup_sgd = gdn_lrs("gdn-mup", "sgd", 64 * m), gdn_lrs("mup", "sgd", 64 * m)
    for name in GATES:
        assert gdn_sgd[name] == pytest.approx(m**-0.5)
        assert mup_sgd[name] == pytest.approx(1.0)
    for name in SCALARS:
        assert gdn_sgd[name] == pytest.approx(m**0.5)
        assert mup_sgd[name] == pytest.approx(1.0)
    assert gdn_sgd["q_proj.weight"] == mup_sgd["q_proj.weight"] == pytest.approx(1.0)  # hidden: η
    for name in ("gdn-mup", "mup"):
        adam = gdn_lrs(name, "adamw", 64 * m)
        assert all(adam[g] == pytest.approx(1 / m) for g in GATES)
        assert all(adam[s] == pytest.approx(1.0) for s in SCALARS)
        assert adam["q_proj.weight"] == pytest.approx(1 / m)


def test_embedding_readout_and_multipliers():
    model = linrnn.build_model("gdn", hidden_size=256)
    applied = P.apply(model, "mup", base_width=64, optimizer="sgd")
    assert applied.lr_multipliers()["embed.weight"] == pytest.approx(4.0)  # input weights: η · fan_out
    assert model.config.logit_multiplier == pytest.approx(1 / 4)
    head_k = model.layers[0].mixer.head_k_dim
    assert model.layers[0].mixer.config.output_multiplier == pytest.approx(head_k / (0.75 * 64 / 2))
    off = linrnn.build_model("gdn", hidden_size=256)
    P.apply(off, "mup", base_width=64, optimizer="sgd", pre_norm_multiplier=False)
    assert off.layers[0].mixer.config.output_multiplier == 1.0
    std = model.layers[0].mixer.q_proj.weight.std().item()
    assert std == pytest.approx(0.02 / 2, rel=0.05)  # σ / √m_in


@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_readout_bias_is_added_after_the_logit_multiplier(optimizer):
    """The logit bias starts at zero, is added outside the 1/m multiplier and has a fixed size: lr multiplier 1 and
    no weight decay under muP at any width, so its step moves the logits equally at every width."""
    torch.manual_seed(0)
    model = linrnn.build_model("gdn", hidden_size=256, tie_embeddings=False, readout_bias=True)
    applied = P.apply(model, "gdn-mup", base_width=64, optimizer=optimizer, readout_zero_init=True)
    assert applied.roles["logit_bias"] == "bias" and applied.lr_multipliers()["logit_bias"] == 1.0
    assert not model.logit_bias.any()
    groups = applied.param_groups(0.1, weight_decay=0.1)
    (group,) = [g for g in groups if any(p is model.logit_bias for p in g["params"])]
    assert group["weight_decay"] == 0.0
    ids = torch.randint(0, 256, (2, 9))
    with torch.no_grad():
        model.lm_head.weight.normal_()
        without = model(ids)
        model.logit_bias.normal_()
        torch.testing.assert_close(model(ids), without + model.logit_bias)
    assert model.config.logit_multiplier == pytest.approx(1 / 4)
    targets = torch.randint(0, 256, (2, 9))
    torch.nn.functional.cross_entropy(model(ids).flatten(0, 1), targets.flatten()).backward()
    probabilities = model(ids).detach().softmax(-1).flatten(0, 1)
    expected = (probabilities - torch.nn.functional.one_hot(targets.flatten(), 256)).mean(0)
    torch.testing.assert_close(model.logit_bias.grad, expected)  # ∂L/∂b: the mean δ, no 1/m factor


def test_heads_growing_with_width_keep_head_dimensions_and_the_multiplier_at_one():
    """With ``base_num_heads`` the base model has that many heads: a model at 4× the width with 4× the heads has
    the base's head dimensions, so §4.3's multiplier is 1, the per-head gate projections are hidden-like (fan-out
    grows too) and the per-head scalars grow as vectors. Without it the base keeps the model's heads."""
    model = linrnn.build_model("gdn", hidden_size=256, num_heads=8)
    applied = P.apply(model, "mup", base_width=64, optimizer="sgd", base_num_heads=2)
    assert model.layers[0].mixer.config.output_multiplier == 1.0
    assert applied.shapes["layers.0.mixer.f_proj.weight"].m_out == 4.0
    assert applied.shapes["layers.0.mixer.A_log"].m_out == 4.0
    fixed_heads = P.apply(linrnn.build_model("gdn", hidden_size=256, num_heads=8), "mup", base_width=64)
    assert fixed_heads.shapes["layers.0.mixer.f_proj.weight"].m_out == 1.0
    assert fixed_heads.model.layers[0].mixer.config.output_multiplier == 4.0  # the base's heads are 4× narrower
    with pytest.raises(ValueError, match=r"base_num_heads.*positive integer.*got 0"):
        P.apply(linrnn.build_model("gdn", hidden_size=256, num_heads=8), "mup", base_width=64, base_num_heads=0)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("optimizer", ["adamw", "sgd"])
def test_base_width_is_sp(cell, optimizer):
    """At the base width every parametrization gives SP's model, multipliers and learning rates."""
    results = {}
    for name in P.list_parametrizations():
        torch.manual_seed(0)
        model = linrnn.build_model(cell, hidden_size=64)
        applied = P.apply(model, name, base_width=64, optimizer=optimizer)
        results[name] = (model, applied)
    sp_model, sp_applied = results["sp"]
    for name, (model, applied) in results.items():
        assert set(applied.lr_multipliers().values()) == {1.0}, name
        assert model.config.logit_multiplier == 1.0
        assert all(layer.mixer.config.output_multiplier == 1.0 for layer in model.layers)
        for (n, p), (_, q) in zip(model.named_parameters(), sp_model.named_parameters(), strict=True):
            assert torch.equal(p, q), (name, n)


def test_refuses_parameters_without_role():
    model = linrnn.build_model("kda", hidden_size=128)
    model.layers[0].mixer.extra = nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="without a role.*extra"):
        P.apply(model, "mup", base_width=64)


def test_bad_arguments():
    model = linrnn.build_model("gla", hidden_size=128)
    with pytest.raises(ValueError, match="'optimizer' must be 'adamw' or 'sgd', got 'lion'"):
        P.apply(model, "mup", base_width=64, optimizer="lion")
    with pytest.raises(ValueError, match="'model' must be a linrnn LanguageModel"):
        P.apply(nn.Linear(2, 2), "mup", base_width=64)
    with pytest.raises(ValueError, match="no base model at base_width = 7"):
        P.apply(model, "mup", base_width=7)  # 0.75 · 7 is not a whole key width


def test_param_groups_weight_decay():
    model = linrnn.build_model("gammanet", hidden_size=256)
    applied = P.apply(model, "gdn-mup", base_width=64, optimizer="adamw")
    groups = applied.param_groups(lr=1e-2, weight_decay=0.1)
    seen = set()
    for group in groups:
        seen.update(group["names"])
        roles = {applied.roles[n] for n in group["names"]}
        if roles & {"norm", "bias", "gate_scalar", "gamma"}:
            assert group["weight_decay"] == 0.0 and roles <= {"norm", "bias", "gate_scalar", "gamma"}
        else:
            multiplier = group["lr"] / 1e-2
            assert group["lr"] * group["weight_decay"] == pytest.approx(1e-2 * 0.1)  # independent of the multiplier
            assert multiplier in (1.0, pytest.approx(0.25))
    assert seen == {n for n, _ in model.named_parameters()}
    torch.optim.AdamW(groups)  # a torch optimizer takes them


# The coordinate check: widths 64-512, 3 steps, sizes averaged over 6 inits (docs/parametrizations.md).
FLAT_BOUND = 0.15
COORD_SEEDS = tuple(range(6))
MUP_SETTINGS = [("gdn-mup", "adamw", 1e-3), ("gdn-mup", "sgd", 0.1)]  # mup under AdamW: the same model, below


@pytest.mark.parametrize("cell", CELLS)
def test_mup_and_gdn_mup_agree_under_adamw(cell):
    """GDN-muP differs from muP only under SGD, so under AdamW the coordinate check of one is the other's."""
    models = [linrnn.build_model(cell, hidden_size=256, tie_embeddings=False) for _ in range(2)]
    mup, gdn_mup = (
        P.apply(model, name, base_width=64, optimizer="adamw", readout_zero_init=True)
        for model, name in zip(models, ("mup", "gdn-mup"), strict=True)
    )
    assert mup.rules == gdn_mup.rules
    assert models[0].config.logit_multiplier == models[1].config.logit_multiplier
    assert [layer.mixer.config.output_multiplier for layer in models[0].layers] == [
        layer.mixer.config.output_multiplier for layer in models[1].layers
    ]


# GammaNet under AdamW: its read Sᵀq̂ grows with width once layer 1's q and k align with the state (slope 0.16 at
# step 3; 0.09 with that layer's q/k frozen), which the √d_k multiplier's independence assumption does not cover
# (docs/parametrizations.md, "Where the check fails"). Strict: the mark goes when the cell passes.
GAMMANET_ADAMW_DRIFT = pytest.mark.xfail(
    strict=True, reason="GammaNet's o drifts with width under AdamW (q-k alignment)"
)
# gdn2 and mamba2 (the newest cells) have no coordinate-check record yet, and each check costs 30-75 s of CI: they
# join when their check has been run and documented
COORD_CELLS = [cell for cell in CELLS if cell not in ("gdn2", "mamba2")]
# GDN and GammaNet under both optimizers; DeltaNet, GLA and KDA under one each, in turn (each check costs 25-55 s of
# CI; every cell and both optimizers stay covered)
ONE_OPTIMIZER = {"deltanet": "adamw", "gla": "sgd", "kda": "adamw"}
COORD_CASES = [
    pytest.param(cell, *setting, marks=GAMMANET_ADAMW_DRIFT if (cell, setting[1]) == ("gammanet", "adamw") else ())
    for setting in MUP_SETTINGS
    for cell in COORD_CELLS
    if ONE_OPTIMIZER.get(cell, setting[1]) == setting[1]
]


@pytest.mark.parametrize(("cell", "parametrization", "optimizer", "lr"), COORD_CASES)
def test_coordinates_flat_in_width_under_mup(cell, parametrization, optimizer, lr):
    """Every module output and every probe (q̂·√d_k, state·√d_k, o, β, decay, logits) keeps its size from width
    64 to 512 at init and after each of 3 steps: |slope of log size against log width| ≤ 0.15."""
    check = coord_check(cell, parametrization, optimizer=optimizer, lr=lr, seeds=COORD_SEEDS)
    sizes = [name for name in check.sizes if not name.startswith("Δ ")]
    assert {"logits", "layers.0.mixer:o", "layers.1.mixer:q_hat_sqrt_d", "layers.1.mixer:state_sqrt_d"} <= set(sizes)
    assert all(np.isfinite(check.sizes[name]).all() and (check.sizes[name][1:] > 0).all() for name in sizes)
    name, step, slope = check.worst_slope()
    where = f"{cell} {parametrization} {optimizer}: {name} at step {step}"
    assert abs(slope) <= FLAT_BOUND, f"{where} has slope {slope:+.3f}"


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize(("optimizer", "lr"), [("adamw", 1e-3), ("sgd", 0.1)])
def test_sp_coordinates_grow_with_width(cell, optimizer, lr):
    """The baseline the check must tell apart: under SP with the same base lr, a hidden activation grows with
    width after a step (slope ≥ 0.25)."""
    check = coord_check(cell, "sp", optimizer=optimizer, lr=lr, steps=1)
    slopes = check.slopes()
    grown = max(slopes[name][1] for name in slopes if not name.startswith("Δ "))
    assert grown >= 0.25


def test_random_readout_logits_vanish_at_init_under_mup():
    """Why the check zero-initialises the readout: with a σ-initialised one, muP's 1/m logit multiplier makes
    the logits at init shrink as m^(-1/2) (Tensor Programs V), which a flatness check would flag."""
    check = coord_check("gated_deltanet", "mup", steps=0, readout_zero_init=False)
    assert check.slopes()["logits"][0] == pytest.approx(-0.5, abs=0.1)
    with pytest.raises(ValueError, match="readout_zero_init=True needs an untied readout"):
        P.apply(linrnn.build_model("gdn", hidden_size=128), "mup", base_width=64, readout_zero_init=True)


def test_coord_check_cli(tmp_path):
    from linrnn.cli import main

    plot = tmp_path / "coords.png"
    args = ["coord-check", "gdn", "--param", "gdn-mup", "--optimizer", "sgd", "--lr", "0.1", "--widths", "64", "128"]
    assert main([*args, "--steps", "1", "--plot", str(plot)]) == 0
    assert plot.stat().st_size > 10_000
