"""The learning-rate sweep (``linrnn sweep``) on CPU with a toy grid: resuming a table, runs shared between
parametrizations that give the same model, the table's rows, the report and its plots, the report's
arithmetic on hand-made losses, and bad input. One module-scoped sweep (17 short runs) feeds most tests."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

pytest.importorskip("torchtitan")

from linrnn import cli  # noqa: E402
from linrnn.cli import sweep as sweep_command  # noqa: E402
from linrnn.training import sweep, sweep_report  # noqa: E402
from linrnn.training.sweep_report import Curves  # noqa: E402

LRS = {"adamw": [1e-3, 1e-2, 3e-2], "sgd": [0.1, 1.0]}
SETTINGS = dict(num_layers=2, num_heads=2, seq_len=64, batch_size=4, steps=20, validation_batches=2)
GRID = [
    "sweep",
    "--cells", "gdn", "--widths", "32", "64", "--base-width", "32", "--layers", "2", "--heads", "2",
    "--seq-len", "64", "--batch-size", "4", "--steps", "20", "--validation-batches", "2",
    "--adamw-lrs", "1e-3", "1e-2", "3e-2", "--sgd-lrs", "0.1", "1.0", "--device", "cpu",
]  # fmt: skip
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def config(**changes) -> sweep.SweepConfig:
    """The toy grid of ``GRID`` as a ``SweepConfig`` (``changes`` replace fields)."""
    return sweep.SweepConfig(**{"widths": [32, 64], "base_width": 32, "lrs": LRS, **SETTINGS, **changes})


CONFIG = config()


def point(row: dict) -> tuple:
    return row["cell"], row["optimizer"], row["parametrization"], row["width"], row["lr"]


def ordered(runs) -> list[sweep.Run]:
    return sorted(runs, key=lambda run: run.key(""))


def by_point(rows: list[dict]) -> dict[tuple, dict]:
    return {point(row): row for row in rows}


@dataclass
class Swept:
    table: Path
    codes: list[int]  # exit codes: the AdamW subset, the whole grid with --time-limit 0, the whole grid
    after_subset: bytes  # the table after each invocation
    pending_after_subset: dict[sweep.Run, list[sweep.Run]]
    after_time_limit: bytes
    after_all: bytes

    @property
    def rows(self) -> list[dict]:
        return sweep.read_table(self.table)


@pytest.fixture(scope="module")
def swept(corpus, tmp_path_factory) -> Swept:
    """The toy grid trained through the CLI in three invocations: AdamW only, then the whole grid with
    ``--time-limit 0`` (trains nothing), then the whole grid (trains the SGD runs)."""
    table = tmp_path_factory.mktemp("sweep") / "sweep.jsonl"
    codes = [cli.main([*GRID, "--optimizers", "adamw", "--table", str(table)])]
    after_subset = table.read_bytes()
    pending_after_subset = sweep.pending(CONFIG, table)
    codes.append(cli.main([*GRID, "--time-limit", "0", "--table", str(table)]))
    after_time_limit = table.read_bytes()
    codes.append(cli.main([*GRID, "--table", str(table)]))
    return Swept(table, codes, after_subset, pending_after_subset, after_time_limit, table.read_bytes())


def test_cli_arguments_give_the_config():
    args = cli.build_parser().parse_args(GRID)
    assert sweep_command.config_from_args(args) == CONFIG
    assert len(CONFIG.runs()) == 3 * (2 * 3 + 2 * 2)  # parametrizations × widths × lrs per optimizer


@pytest.mark.parametrize(("flag", "field", "value"), [("--max-norm", "max_norm", 1e6), ("--momentum", "momentum", 0.9)])
def test_training_settings_reach_the_config_and_the_hash(flag, field, value):
    """``--max-norm`` and ``--momentum`` reach the config and change the settings hash (a table keeps clipped and
    unclipped runs, or two momenta, apart)."""
    changed = sweep_command.config_from_args(cli.build_parser().parse_args([*GRID, flag, str(value)]))
    assert getattr(changed, field) == value != getattr(CONFIG, field)
    assert changed.settings_hash() != CONFIG.settings_hash()


def test_readout_bias_reaches_the_model_and_leaves_old_settings_alone():
    """``--readout-bias`` builds the logit bias and changes the settings hash; without it the settings have no
    such key, so tables written before the option existed keep their hash."""
    with_bias = sweep_command.config_from_args(cli.build_parser().parse_args([*GRID, "--readout-bias"]))
    assert with_bias.readout_bias and "readout_bias" not in CONFIG.settings()
    assert with_bias.settings_hash() != CONFIG.settings_hash()
    run = sweep.Run(cell="gated_deltanet", optimizer="sgd", parametrization="gdn-mup", width=64, lr=0.1)
    model = sweep.build_model(with_bias, run, torch.device("cpu"))
    assert model.applied.roles["logit_bias"] == "bias"
    assert "logit_bias" not in sweep.build_model(CONFIG, run, torch.device("cpu")).applied.roles


def test_heads_grow_with_width_at_fixed_head_dimensions():
    """``--heads-grow`` gives ``--heads`` heads at the base width and proportionally more above it, at the base's
    head dimensions; it changes the settings hash, is absent from the settings when off, and refuses widths whose
    head count would not be whole."""
    growing = sweep_command.config_from_args(cli.build_parser().parse_args([*GRID, "--heads-grow"]))
    assert growing.heads(32) == 2 and growing.heads(64) == 4 and CONFIG.heads(64) == 2
    assert "heads_grow" not in CONFIG.settings() and growing.settings_hash() != CONFIG.settings_hash()
    run = sweep.Run(cell="gated_deltanet", optimizer="sgd", parametrization="mup", width=64, lr=0.1)
    wide = sweep.build_model(growing, run, torch.device("cpu")).model.layers[0].mixer
    base = sweep.build_model(growing, run.model_copy(update={"width": 32}), torch.device("cpu")).model.layers[0].mixer
    assert wide.num_heads == 4 and wide.head_k_dim == base.head_k_dim and wide.config.output_multiplier == 1.0
    with pytest.raises(ValidationError, match="heads_grow.*multiple of the base width 32"):
        config(widths=[32, 48], heads_grow=True, num_heads=1)


# ----------------------------------------------------------------------------------------------------------
# resuming


def test_resuming_trains_only_the_missing_runs_and_keeps_the_rows(swept):
    assert swept.codes == [0, 0, 0]
    subset = [json.loads(line) for line in swept.after_subset.decode().splitlines()]
    assert len(subset) == 3 * 2 * 3 and {row["optimizer"] for row in subset} == {"adamw"}
    # what was left: the SGD runs only, 4 trained runs at width 64 (sp, mup, gdn-mup differ) + 2 shared at 32
    left = swept.pending_after_subset
    assert {run.optimizer for run in left} == {"sgd"}
    assert len(left) == 3 * 2 + 2
    assert ordered(p for points in left.values() for p in points) == ordered(
        run for run in CONFIG.runs() if run.optimizer == "sgd"
    )
    # --time-limit 0: no run starts, the table is untouched
    assert swept.after_time_limit == swept.after_subset
    # the last invocation appended the SGD rows after the AdamW rows, which are byte-identical
    assert swept.after_all.startswith(swept.after_subset)
    assert len(swept.after_all.decode().splitlines()) == len(CONFIG.runs())
    assert sweep.pending(CONFIG, swept.table) == {}
    assert swept.table.read_bytes() == swept.after_all  # later tests do not write into the shared table


def test_changed_settings_make_every_grid_point_pending_and_the_report_ignores_old_rows(swept, tmp_path):
    table = tmp_path / "sweep.jsonl"
    table.write_bytes(swept.after_all)
    shorter = config(steps=10)
    assert shorter.settings_hash() != CONFIG.settings_hash()
    assert config(seed=1).settings_hash() != CONFIG.settings_hash()
    assert config(widths=[32, 64, 128]).settings_hash() == CONFIG.settings_hash()  # grid axes are not settings
    todo = sweep.pending(shorter, table)
    assert todo == sweep.pending(shorter, tmp_path / "empty.jsonl")  # no row of the table counts
    assert ordered(p for points in todo.values() for p in points) == ordered(CONFIG.runs())
    assert cli.main([*GRID, "--steps", "5", "--report-only", "--table", str(table)]) == 1  # no rows: no report

    # one grid point with the new settings: its 3 rows are appended, the report shows only them
    small = ["--steps", "10", "--optimizers", "sgd", "--widths", "32", "--sgd-lrs", "0.1"]
    assert cli.main([*GRID, *small, "--table", str(table)]) == 0
    text = table.read_bytes()
    assert text.startswith(swept.after_all)
    new = sweep.read_table(table)[len(CONFIG.runs()) :]
    assert [(row["parametrization"], row["steps"], row["shared"]) for row in new] == [
        ("sp", 10, None), ("mup", 10, "sp"), ("gdn-mup", 10, "sp"),
    ]  # fmt: skip
    assert all(row["key"].endswith("/" + shorter.settings_hash()) for row in new)
    report = (tmp_path / "sweep_report.md").read_text()
    assert "10 steps" in report and "20 steps" not in report
    assert "width 64" not in report and "adamw" not in report
    assert f"0.1 (edge) ({new[0]['val_loss']:.3f})" in report
    assert not (tmp_path / "sweep_lr_transfer_gated_deltanet_adamw.png").exists()


# ----------------------------------------------------------------------------------------------------------
# runs shared between parametrizations


def test_the_base_width_is_trained_once_for_every_parametrization(swept):
    rows = by_point(swept.rows)
    for optimizer, lrs in LRS.items():
        for lr in lrs:
            sp = rows["gated_deltanet", optimizer, "sp", 32, lr]
            assert sp["shared"] is None
            for param in ("mup", "gdn-mup"):
                row = rows["gated_deltanet", optimizer, param, 32, lr]
                assert row["shared"] == "sp"
                assert (row["val_loss"], row["loss_curve"]) == (sp["val_loss"], sp["loss_curve"])


def test_mup_and_gdn_mup_share_runs_under_adamw_but_not_under_sgd(swept):
    rows = by_point(swept.rows)
    for lr in LRS["adamw"]:
        mup, gdn = rows["gated_deltanet", "adamw", "mup", 64, lr], rows["gated_deltanet", "adamw", "gdn-mup", 64, lr]
        sp = rows["gated_deltanet", "adamw", "sp", 64, lr]
        assert (mup["shared"], gdn["shared"], sp["shared"]) == (None, "mup", None)
        assert gdn["val_loss"] == mup["val_loss"]
        assert sp["val_loss"] != mup["val_loss"]  # above the base width muP is another model
    sgd = [(rows["gated_deltanet", "sgd", "mup", 64, lr], rows["gated_deltanet", "sgd", "gdn-mup", 64, lr])
           for lr in LRS["sgd"]]  # fmt: skip
    assert all(mup["shared"] is None and gdn["shared"] is None for mup, gdn in sgd)
    assert any(mup["val_loss"] != gdn["val_loss"] for mup, gdn in sgd)

    todo = sweep.pending(CONFIG, Path("/nonexistent/sweep.jsonl"))
    assert len(todo) == 2 * 3 + 3 + 2 * 3 + 2  # AdamW: w64 sp, mup (+gdn-mup), w32; SGD: w64 × 3, w32
    for run, points in todo.items():
        assert run in points
        if run.optimizer == "sgd" and run.width == 64:
            assert points == [run]
        elif run.width == 64:
            assert [p.parametrization for p in points] == {"sp": ["sp"], "mup": ["mup", "gdn-mup"]}[run.parametrization]
        else:
            assert run.parametrization == "sp" and [p.parametrization for p in points] == ["sp", "mup", "gdn-mup"]


def test_a_shared_row_equals_the_run_trained_on_its_own(swept):
    """The training signature is right: GDN-muP under AdamW at width 64, trained itself, gives mup's row."""
    import torch

    run = sweep.Run(cell="gated_deltanet", optimizer="adamw", parametrization="gdn-mup", width=64, lr=1e-2)
    row = sweep.train_run(CONFIG, run, sweep.Corpus(CONFIG), torch.device("cpu"))
    shared = by_point(swept.rows)[point(row)]
    assert shared["shared"] == "mup"
    assert (row["val_loss"], row["loss_curve"]) == (shared["val_loss"], shared["loss_curve"])


# ----------------------------------------------------------------------------------------------------------
# the table and the report


def test_the_table_has_one_row_per_grid_point(swept):
    rows = swept.rows
    settings = CONFIG.settings_hash()
    assert sorted(point(row) for row in rows) == sorted(tuple(run.model_dump().values()) for run in CONFIG.runs())
    assert len({row["key"] for row in rows}) == len(rows)
    keys = {"cell", "optimizer", "parametrization", "width", "lr", "val_loss", "diverged", "loss_curve", "key",
            "settings", "shared"}  # fmt: skip
    axes = {"cells", "optimizers", "parametrizations", "widths", "lrs"}
    expected_settings = CONFIG.model_dump(mode="json", exclude=axes | {"readout_bias", "heads_grow"})  # off: left out
    for row in rows:
        assert keys <= row.keys()
        assert row["key"] == sweep.Run(**{k: row[k] for k in sweep.Run.model_fields}).key(settings)
        assert row["settings"] == expected_settings and row["base_width"] == 32
        assert row["diverged"] is False and row["steps"] == 20 and len(row["loss_curve"]) == 2
        assert math.isfinite(row["val_loss"]) and row["val_loss"] < math.log(4096) + 1
        assert row["val_bpb"] > 0 and math.isfinite(row["train_loss"])
        # gradient norms before clipping, every 10th step: the global one is the root sum of squares of the roles'
        roles = row["role_grad_norms"]
        assert {"embedding", "readout", "hidden", "norm"} <= roles.keys() and len(row["grad_norm_curve"]) == 2
        for step, total in enumerate(row["grad_norm_curve"]):
            assert total == pytest.approx(math.sqrt(sum(norms[step] ** 2 for norms in roles.values())), rel=2e-3)
    assert min(row["val_loss"] for row in rows) < math.log(4096) - 1  # the good learning rates learn something


def test_the_report_and_plots(swept):
    folder = swept.table.parent
    for optimizer in ("adamw", "sgd"):
        png = folder / f"sweep_lr_transfer_gated_deltanet_{optimizer}.png"
        assert png.stat().st_size > 1000 and png.read_bytes()[:8] == PNG_SIGNATURE
    report = (folder / "sweep_report.md").read_text()
    lines = report.splitlines()
    assert lines[0] == (
        "| cell | optimizer | parametrization | best lr, width 32 | best lr, width 64 | transfer score "
        "| transfer regret |"
    )
    summary = [line.split(" | ") for line in lines[2:8]]
    assert [(cells[1], cells[2]) for cells in summary] == [
        (optimizer, label) for optimizer in ("adamw", "sgd") for label in ("SP", "muP", "GDN-muP")
    ]
    # best lr and transfer score recomputed from the rows
    names = {"SP": "sp", "muP": "mup", "GDN-muP": "gdn-mup"}
    rows = by_point(swept.rows)
    for cells in summary:
        optimizer, param = cells[1], names[cells[2]]
        lrs = LRS[optimizer]
        loss = {(w, lr): rows["gated_deltanet", optimizer, param, w, lr]["val_loss"] for w in (32, 64) for lr in lrs}
        best = {w: min(lrs, key=lambda lr: loss[w, lr]) for w in (32, 64)}
        for width, cell in zip((32, 64), cells[3:5], strict=True):
            assert re.fullmatch(rf"{best[width]:.3g}( \(edge\))? \({loss[width, best[width]]:.3f}\)", cell), cell
        score = abs(lrs.index(best[64]) - lrs.index(best[32]))
        assert cells[5] == str(score)
        assert cells[6].rstrip(" |") == f"{loss[64, best[32]] - loss[64, best[64]]:.3f}"


# ----------------------------------------------------------------------------------------------------------
# the report's arithmetic


def curves(losses: dict[int, list[float | None]], base_width: int = 32) -> Curves:
    lrs = [1e-3, 3e-3, 1e-2, 3e-2, 1e-1]
    return Curves("gated_deltanet", "adamw", "mup", base_width, lrs,
                  {w: dict(zip(lrs, values, strict=True)) for w, values in losses.items()})  # fmt: skip


def test_curves_best_edge_and_shift():
    c = curves({32: [5.0, 4.5, 4.0, 4.2, None], 64: [3.0, 3.5, 3.7, 3.9, 4.4], 128: [None, 6.0, 5.0, 5.5, 5.1]})
    assert c.widths == [32, 64, 128]
    assert c.best(32) == (1e-2, 4.0) and c.best_index(32) == 2 and not c.at_edge(32)
    assert c.best(64) == (1e-3, 3.0) and c.at_edge(64)
    assert c.best(128) == (1e-2, 5.0)
    shifted = c.shifted(32)
    assert min(v for v in shifted.values() if v is not None) == 0
    assert shifted[1e-1] is None  # diverged
    finished = {lr: v for lr, v in shifted.items() if v is not None}
    assert finished == pytest.approx({1e-3: 1.0, 3e-3: 0.5, 1e-2: 0.0, 3e-2: 0.2})
    assert c.shifted(128)[1e-3] is None and c.shifted(128)[3e-2] == pytest.approx(0.5)
    assert c.transfer_score() == 2


def test_curves_transfer_score():
    c = curves({32: [5.0, 4.5, 4.0, 4.2, 4.3], 64: [5.0, 4.5, 4.4, 4.2, 4.0]})
    assert (c.best_index(32), c.best_index(64)) == (2, 4) and c.transfer_score() == 2
    assert curves({32: [5.0, 4.0, 4.5, 4.6, 4.7], 64: [5.0, 4.1, 4.5, 4.6, 4.7]}).transfer_score() == 0
    # diverged runs are never the best, however low the others
    diverged = curves({32: [None, None, 9.0, None, None], 64: [9.0, 8.0, None, None, None]})
    assert diverged.best(32) == (1e-2, 9.0) and diverged.best(64) == (3e-3, 8.0)
    assert diverged.transfer_score() == 1
    # a base width whose runs all diverged: no score
    assert curves({32: [None] * 5, 64: [4.0, 3.0, 3.5, 3.6, 3.7]}).transfer_score() is None
    assert curves({32: [None] * 5}).best(32) is None and not curves({32: [None] * 5}).at_edge(32)
    assert curves({64: [5.0, 4.0, 4.5, 4.6, 4.7]}).transfer_score() is None  # no base-width curve


def test_curves_transfer_regret():
    """The loss of training every width at the base width's best lr, against each width's own best."""
    c = curves({32: [5.0, 4.5, 4.0, 4.2, 4.3], 64: [5.0, 4.5, 4.4, 4.2, 4.0], 128: [3.0, 2.9, 3.1, 2.8, 3.5]})
    assert c.transfer_regret() == pytest.approx(0.4)  # 64 at 1e-2: 4.4 − 4.0; 128: 3.1 − 2.8 = 0.3
    assert curves({32: [5.0, 4.0, 4.5, 4.6, 4.7], 64: [5.0, 4.1, 4.5, 4.6, 4.7]}).transfer_regret() == 0
    assert curves({32: [5.0, 4.0, 4.5, 4.6, 4.7], 64: [5.0, None, 4.5, 4.6, 4.7]}).transfer_regret() == math.inf
    assert curves({32: [None] * 5, 64: [4.0, 3.0, 3.5, 3.6, 3.7]}).transfer_regret() is None
    partial = curves({32: [5.0, 4.0, 4.5, 4.6, 4.7], 64: [5.0, 4.1, 4.5, 4.6, 4.7]})
    del partial.losses[64][3e-3]  # the base's best lr not run at width 64 yet: that width is left out
    assert partial.transfer_regret() == 0


def parabola(optimum: float, depth: float = 4.0, lrs=(1e-3, 3e-3, 1e-2, 3e-2, 1e-1)) -> list[float]:
    return [depth + 0.3 * math.log(lr / optimum) ** 2 for lr in lrs]


def test_curves_fitted_optimum_and_shift():
    """The fitted lr is the vertex of a parabola in log lr; the shift is in grid steps (median log ratio)."""
    c = curves({32: parabola(5e-3), 64: parabola(2e-2, depth=3.0)})
    assert c.fitted_lr(32) == pytest.approx(5e-3, rel=1e-9) and c.fitted_lr(64) == pytest.approx(2e-2, rel=1e-9)
    step = (math.log(3) + math.log(10 / 3)) / 2  # the median of the grid's neighbouring log ratios
    assert c.fitted_shift() == pytest.approx(math.log(4) / step, rel=1e-9)
    # a flat, noisy basin: the argmin jumps by 3 grid steps, the fitted optimum by less than one
    noisy = curves({32: [4.61, 4.5, 4.52, 4.49, 4.9], 64: [4.6, 4.48, 4.5, 4.55, 4.9]})
    assert noisy.transfer_score() == 2 and noisy.fitted_shift() < 0.5
    # diverged runs are left out of the fit; too few runs, a downward parabola or a vertex outside: no optimum
    partial = curves({32: parabola(5e-3)[:4] + [None], 64: [None, None, 4.0, 4.1, None]})
    assert partial.fitted_lr(32) == pytest.approx(5e-3, rel=1e-9) and partial.fitted_lr(64) is None
    assert partial.fitted_shift() is None
    assert curves({32: [4.0, 4.5, 4.6, 4.5, 4.0]}).fitted_lr(32) is None  # opens downward
    assert curves({32: [5.0, 4.8, 4.6, 4.4, 4.3]}).fitted_lr(32) is None  # vertex above the grid
    assert curves({64: parabola(5e-3)}).fitted_shift() is None  # no base-width curve


def seed_rows(seed: int, losses: dict[tuple[int, float], float | None], **settings) -> list[dict]:
    common = {"cell": "gated_deltanet", "optimizer": "sgd", "parametrization": "gdn-mup", "base_width": 32}
    return [{**common, "width": w, "lr": lr, "val_loss": loss, "diverged": loss is None,
             "settings": {"steps": 10, "seed": seed, **settings}} for (w, lr), loss in losses.items()]  # fmt: skip


def test_mean_over_seeds():
    """Points run under every seed get the mean loss (diverged if one diverged) and the spread; others are left out."""
    first = seed_rows(0, {(32, 0.1): 5.0, (32, 0.2): 4.0, (64, 0.1): 3.0, (64, 0.2): 6.0})
    second = seed_rows(1, {(32, 0.1): 5.5, (32, 0.2): 4.4, (64, 0.1): None})
    rows, spread = sweep_report.mean_over_seeds({"a": first, "b": second})
    by_point = {(row["width"], row["lr"]): row for row in rows}
    assert set(by_point) == {(32, 0.1), (32, 0.2), (64, 0.1)}  # (64, 0.2) has one seed only
    assert by_point[32, 0.1]["val_loss"] == pytest.approx(5.25) and by_point[32, 0.2]["val_loss"] == pytest.approx(4.2)
    assert by_point[64, 0.1]["diverged"] and by_point[64, 0.1]["val_loss"] is None
    key = ("gated_deltanet", "sgd", "gdn-mup")
    assert spread[*key, 32, 0.2] == pytest.approx(0.4) and spread[*key, 64, 0.1] is None
    assert all(row["settings"]["seed"] == [0, 1] for row in rows)
    with pytest.raises(ValueError, match=r"table b's settings differ from a's in \['steps'\]"):
        sweep_report.mean_over_seeds({"a": first, "b": seed_rows(1, {(32, 0.1): 5.0}, steps=20)})
    with pytest.raises(ValueError, match="table b has seed 0, already in another table"):
        sweep_report.mean_over_seeds({"a": first, "b": seed_rows(0, {(32, 0.1): 5.0})})
    with pytest.raises(ValueError, match="table b has no rows"):
        sweep_report.mean_over_seeds({"a": first, "b": []})


def test_seed_mean_script_writes_the_report_and_the_plot(tmp_path):
    import subprocess
    import sys

    settings = {"num_layers": 2, "num_heads": 2, "batch_size": 4, "seq_len": 16, "warmup_fraction": 0.1,
                "min_lr_factor": 0.01}  # fmt: skip
    tables = []
    for seed, shift in ((0, 0.0), (1, 0.2)):
        losses = {(w, lr): 4.0 + shift + math.log(lr / 0.2) ** 2 for w in (32, 64) for lr in (0.1, 0.2, 0.4)}
        tables.append(tmp_path / f"seed{seed}.jsonl")
        sweep.append_rows(tables[-1], seed_rows(seed, losses, **settings))
    script = Path(__file__).parents[2] / "tools" / "sweep_seed_mean.py"
    subprocess.run([sys.executable, str(script), *map(str, tables), "--out", str(tmp_path / "mean")], check=True)
    report = (tmp_path / "mean_report.md").read_text()
    assert "seed [0, 1]" in report and "median 0.200, largest 0.200" in report
    assert (tmp_path / "mean_lr_transfer_gated_deltanet_sgd.png").stat().st_size > 0


# ----------------------------------------------------------------------------------------------------------
# bad input


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        (dict(base_width=48), "base_width"),
        (dict(lrs={"adamw": [1e-3]}), "lrs"),
        (dict(lrs={"adamw": [1e-3], "sgd": []}), "lrs"),
        (dict(parametrizations=["sp", "umup"]), "parametrizations"),
        (dict(cells=["gdn", "lstm"]), "cells"),
        (dict(widths=[32, 32]), "widths"),
    ],
)
def test_bad_config(changes, named):
    with pytest.raises(ValidationError, match=named):
        config(**changes)


def test_bad_cli_arguments(tmp_path):
    table = tmp_path / "sweep.jsonl"
    assert cli.main([*GRID, "--workers", "0", "--table", str(table)]) == 2
    assert cli.main([*GRID, "--base-width", "48", "--table", str(table)]) == 2
    assert cli.main([*GRID, "--params", "umup", "--table", str(table)]) == 2
    assert cli.main([*GRID, "--max-norm", "0", "--table", str(table)]) == 2
    assert not table.exists()


# ----------------------------------------------------------------------------------------------------------
# worker processes


def test_two_workers_give_the_rows_of_one(swept, tmp_path):
    """Two spawned CPU workers (one SGD run each at the base width, added to a table that holds a row of width 64):
    the same rows as in-process (fixed seeds)."""
    table = tmp_path / "workers.jsonl"
    wide = next(row for row in swept.rows if row["width"] == 64 and row["optimizer"] == "sgd")
    table.write_text(json.dumps(wide) + "\n")
    assert cli.main([*GRID, "--optimizers", "sgd", "--widths", "32", "--workers", "2", "--table", str(table)]) == 0
    rows, reference = sweep.read_table(table)[1:], {row["key"]: row for row in swept.rows}
    assert len(rows) == 2 * 3
    for row in rows:
        assert (row["val_loss"], row["loss_curve"], row["shared"]) == (
            reference[row["key"]]["val_loss"], reference[row["key"]]["loss_curve"], reference[row["key"]]["shared"],
        )  # fmt: skip
