"""linrnn.stability: transitions against the cells' own recurrence, the measures, the certificates under random
and adversarial search, the GammaNet note's KDA-F counterexample, a model's actual gates, and the CLI."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import linrnn
from linrnn import stability
from linrnn.cli import main
from linrnn.models import load_checkpoint, save_checkpoint
from tests.helpers import CELLS, OPS, make_inputs

SEED_F = torch.tensor([[1.0, 2.0], [0.0, 1.0]], dtype=torch.float64)


def transition_args(cell, inputs):
    """``transition`` arguments for step 0, head 0 of ``make_inputs`` tensors."""
    needs = stability.needed_inputs(cell)
    structure = linrnn.get_cell(cell).structure
    given = {
        "decay": inputs["g"][0, 0, 0].exp() if "g" in inputs else None,
        "beta": inputs["beta"][0, 0, 0] if "beta" in inputs else None,
        "erase_gate": inputs["b"][0, 0, 0] if "b" in inputs else None,
        "erase": (inputs["a"] if structure.erase == "decoupled" else inputs["k"])[0, 0, 0],
        "gamma": inputs["log_gamma"][0].exp() if "log_gamma" in inputs else None,
    }
    return {name: value for name, value in given.items() if name in needs}


@pytest.mark.parametrize("cell", CELLS)
def test_transition_is_the_cells_recurrence(cell):
    """One step of the cell's reference op with v = 0 maps S_0 to A S_0."""
    for seed in range(3):
        inputs = make_inputs(cell, B=1, T=1, H=1, K=5, V=7, initial_state=True, seed=seed)
        inputs["v"] = torch.zeros_like(inputs["v"])
        _, final = OPS[cell](**inputs, output_final_state=True, backend="reference")
        A = stability.transition(cell, **transition_args(cell, inputs))
        state = inputs["initial_state"][0, 0]
        expected = A @ state if A.shape[-1] == state.shape[0] else A[0, 0] * state  # α I as the 1 × 1 [α]
        torch.testing.assert_close(final[0, 0], expected, rtol=1e-12, atol=1e-12)


def test_gammanet_is_kda_f_with_orthogonal_columns_in_tilde_coordinates():
    """With F = QΓ and κ = Q a, GammaNet's transition is Fᵀ A_kda_f F⁻ᵀ (the GammaNet note's S̃ = S F, transposed)."""
    gen = torch.Generator().manual_seed(3)
    K = 6
    Q = torch.linalg.qr(torch.randn(K, K, generator=gen, dtype=torch.float64)).Q
    gamma = torch.exp(torch.randn(K, generator=gen, dtype=torch.float64))
    a = F.normalize(torch.randn(K, generator=gen, dtype=torch.float64), dim=0)
    alpha = torch.rand(K, generator=gen, dtype=torch.float64)
    basis = Q * gamma
    gammanet = stability.transition("gammanet", decay=alpha, beta=1.3, erase=a, gamma=gamma)
    kda_f = stability.transition("kda_f", decay=alpha, beta=1.3, erase=Q @ a, F=basis)
    torch.testing.assert_close(gammanet, basis.T @ kda_f @ torch.linalg.inv(basis.T), rtol=1e-10, atol=1e-10)


def test_aliases_and_scalar_decay():
    e = F.normalize(torch.randn(4, dtype=torch.float64), dim=0)
    torch.testing.assert_close(
        stability.transition("gdn", decay=0.5, beta=1.0, erase=e),
        stability.transition("kda", decay=torch.full((4,), 0.5, dtype=torch.float64), beta=1.0, erase=e),
    )


@pytest.mark.parametrize(
    "cell, args, message",
    [
        ("kda", {"decay": 0.5, "beta": 0.5}, "argument 'erase' is required"),
        ("gla", {"decay": torch.ones(3), "beta": 0.5}, "takes no 'beta'"),
        ("deltanet", {"decay": 0.5, "beta": 0.5, "erase": torch.tensor([1.0, 0.0])}, "takes no 'decay'"),
        ("kda", {"decay": -0.1, "beta": 0.5, "erase": torch.tensor([1.0, 0.0])}, "exp(g) in [0, 1]"),
        ("kda", {"decay": 0.5, "beta": 2.5, "erase": torch.tensor([1.0, 0.0])}, "'beta' must be in [0, 2]"),
        ("kda", {"decay": 0.5, "beta": 0.5, "erase": torch.tensor([1.0, 1.0])}, "unit vectors"),
        ("kda", {"decay": torch.ones(3), "beta": torch.tensor(0.5), "erase": torch.tensor([1.0, 0.0])}, "K = 2"),
        ("gdn", {"decay": torch.ones(2), "beta": torch.tensor(0.5), "erase": torch.tensor([1.0, 0.0])}, "one multi"),
        ("gammanet", {"decay": 0.5, "beta": 0.5, "erase": torch.tensor([1.0, 0.0]), "gamma": torch.tensor([1.0, 0.0])},
         "positive diagonal"),
        ("kda_f", {"decay": 0.5, "beta": 0.5, "erase": torch.tensor([1.0, 0.0]), "F": torch.ones(2, 2)}, "invertible"),
        ("gla", {"decay": 0.5}, "per channel"),
        ("lstm", {"decay": 0.5}, "unknown cell 'lstm'"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named(cell, args, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        stability.transition(cell, **args)


def test_measures_against_explicit_products():
    gen = torch.Generator().manual_seed(0)
    As = torch.randn(3, 12, 5, 5, generator=gen, dtype=torch.float64) / 2
    product = torch.eye(5, dtype=torch.float64).expand(3, 5, 5)
    logs = []
    for t in range(12):
        product = As[:, t] @ product
        logs.append(torch.linalg.matrix_norm(product, ord=2).log())
    torch.testing.assert_close(stability.log_growth(As), torch.stack(logs, -1), rtol=1e-10, atol=1e-10)
    # a diagonal sequence: Lyapunov exponents are the mean log |entries|, sorted (the QR iteration orders them)
    diag = torch.tensor([0.5, 2.0, 1.0], dtype=torch.float64)
    exponents = stability.lyapunov_exponents(torch.diag(diag).expand(400, 3, 3))
    torch.testing.assert_close(exponents, diag.log().sort(descending=True).values, rtol=0, atol=0.02)


def test_seed_example_is_flagged_unstable():
    example = stability.seed_example()
    A = stability.transition("kda_f", **example)
    radius = float(stability.spectral_radius(A))
    assert abs(radius - 1.0495) < 1e-4
    growth = stability.log_growth(A.expand(200, 2, 2))[-1].exp()
    assert growth > radius**200 / 10  # grows like ρ^T (1.7e4 at T = 200)
    lyapunov = stability.lyapunov_exponents(A.expand(2000, 2, 2))[0]
    assert abs(float(lyapunov) - math.log(radius)) < 2e-3
    report = stability.check("kda_f", key_dim=2, F=SEED_F, draws=2000, restarts=12, steps=100)
    assert not report.passed and report.verdict.startswith("UNSTABLE")
    assert report.max_spectral_radius >= radius - 1e-6  # at least as bad as the seed's hand-picked inputs
    print(f"\nseed example: ρ = {radius:.6f}, ‖A^200‖₂ = {float(growth):.4g}; search with the seed's F: "
          f"ρ = {report.max_spectral_radius:.4f}")  # fmt: skip


@pytest.mark.parametrize("cell", CELLS)
def test_every_cell_passes_its_certificate(cell):
    """10⁴ random steps and 48 starts × 200 Adam steps, beta in [0, 2], cond(Γ) up to 10³."""
    report = stability.check(cell, key_dim=8, draws=10_000, restarts=48, steps=200, beta_max=2.0, gamma_cond=1e3)
    print(f"\n{cell}: {report.summary()}")
    assert report.draws >= 10_000
    assert report.passed, report.summary()
    assert report.max_spectral_radius > 1 - 1e-6  # the search reaches the boundary (α = 1 or β = 0 give ρ = 1)
    if cell == "gammanet":
        assert report.max_norm > 10  # ‖A‖₂ itself is not bounded by 1: the certificate is in the Γ metric
        assert report.max_growth_ratio > 0.5  # and growth comes close to cond(Γ)


def test_search_finds_unstable_general_basis_from_random_start():
    report = stability.check("kda_f", key_dim=4, F="general", draws=0, restarts=12, steps=60, seed=1)
    assert report.max_spectral_radius > 1.01 and not report.passed


def test_orthogonal_columns_are_never_unstable():
    report = stability.check("kda_f", key_dim=6, F="orthogonal", draws=10_000, restarts=48, steps=150)
    assert report.passed, report.summary()


def test_search_climbs():
    """The adversarial search, not the start, finds the growth: its last snapshot beats its first."""
    snapshots = stability.adversarial_inputs("kda_f", restarts=6, steps=50, horizon=8, key_dim=3, F=SEED_F.new_tensor(
        [[1.0, 2.0, 0.0], [0.0, 1.0, 0.0], [0.5, 0.0, 1.0]]))  # fmt: skip
    first, last = (stability.measure("kda_f", s).spectral_radius[:, 0].max() for s in (snapshots[0], snapshots[-1]))
    assert last > first


@pytest.mark.parametrize("cell", CELLS)
def test_model_gates_per_layer(cell):
    torch.manual_seed(0)
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=3)
    if cell == "gammanet":
        for layer in model.layers:
            layer.mixer.log_gamma.data.normal_(0, 1.0)
    ids = torch.randint(0, 256, (2, 40))
    captured = stability.model_inputs(model, ids)
    assert [c for c, _ in captured] == [linrnn.get_cell(cell).name] * 3
    heads = model.config.num_heads
    for _, inputs in captured:
        for x in inputs.values():
            assert x.shape[:2] in ((2 * heads, 40), (2 * heads, 1))
    reports = stability.check_model(model, ids)
    assert len(reports) == 3 and all(r.passed for r in reports)
    if cell != "deltanet":
        assert all(0 < r.mean_decay < 1 for r in reports)


def test_model_inputs_are_what_the_op_sees():
    """Running the reference recurrence on the captured gates with v = 0 reproduces growth ‖∏A‖ for one head."""
    torch.manual_seed(1)
    model = linrnn.build_model("kda", preset="byte-tiny", num_layers=1)
    ids = torch.randint(0, 256, (1, 9))
    ((_, inputs),) = stability.model_inputs(model, ids)
    mixer = model.layers[0].mixer
    with torch.no_grad():
        x = model.layers[0].mixer_norm(model.embed(ids))
        projected = mixer.project(x)
        q, k, v, extra, _ = mixer.streams(projected)
        gates = mixer.gates(projected, k, extra)
    torch.testing.assert_close(inputs["decay"][0], gates["g"][0, :, 0].double().exp())
    torch.testing.assert_close(inputs["erase"][1], F.normalize(k[0, :, 1].double(), dim=-1))


def test_checkpoint_roundtrip_and_cli(tmp_path):
    torch.manual_seed(0)
    model = linrnn.build_model("gdn", preset="byte-tiny")
    save_checkpoint(model, tmp_path / "gdn.pt")
    loaded = load_checkpoint(tmp_path / "gdn.pt")
    ids = torch.randint(0, 256, (1, 20))
    torch.testing.assert_close(loaded(ids), model(ids))
    assert main(["stability", "--checkpoint", str(tmp_path / "gdn.pt")]) == 0
    plot = tmp_path / "growth.png"
    assert main(["stability", "gdn", "kda_f", "--draws", "256", "--restarts", "6", "--steps", "5", "--plot",
                 str(plot)]) == 0  # fmt: skip
    assert plot.stat().st_size > 10_000
    with pytest.raises(ValueError, match="not a linrnn checkpoint"):
        torch.save({"weights": 1}, tmp_path / "other.pt")
        load_checkpoint(tmp_path / "other.pt")


def test_progress_is_a_line_per_cell(capsys):
    """A check of all cells takes minutes: what it runs is said first, then each cell's verdict and time as it
    finishes, on a terminal or not (rich's bar shows on a terminal only)."""
    assert main(["stability", "gla", "deltanet", "--draws", "64", "--restarts", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("checking 2 cells: 64 random steps each"), lines[0]
    assert [line.rsplit(" (", 1)[0] for line in lines[1:3]] == [
        "[1/2] gla: stable: certificate holds", "[2/2] deltanet: stable: certificate holds",
    ]  # fmt: skip
    assert all(line.endswith(" s)") for line in lines[1:3]), lines[1:3]
