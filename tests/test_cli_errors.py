"""Errors in the ``linrnn`` command's arguments and inputs: one line on stderr naming the argument, the expected and
the actual value, exit status 2, no traceback (unless ``--debug``), before any computation. Also the library's
checks behind them (``load_checkpoint``, ``generate``) and the name aliases."""

import os

import pytest
import torch

import linrnn
from linrnn import parametrizations
from linrnn.cli import build_parser, main
from linrnn.cli import coord_check as coord_check_command
from linrnn.cli import stability as stability_command
from linrnn.errors import UsageError
from linrnn.models import load_checkpoint, model_config, save_checkpoint
from linrnn.models.config import PRESET_ALIASES
from linrnn.training import names


def error_line(capsys, argv: list[str]) -> str:
    """Runs ``linrnn argv``, checks it fails with exit status 2 and one line on stderr, and returns that line."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def no_computation(monkeypatch):
    """Fails the test if the stability check or the coordinate check starts."""

    def forbidden(*args, **kwargs):
        raise AssertionError("the computation started before the arguments were checked")

    monkeypatch.setattr(stability_command, "check", forbidden)
    monkeypatch.setattr(coord_check_command, "coord_check", forbidden)


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["stability", "foo"], ["linrnn stability:", "argument cells", "'foo'"]),
        (["stability", "gdn", "foo"], ["argument cells", "'foo'"]),
        (["stability", "--dim", "0"], ["argument --dim", "positive integer", "got 0"]),
        (["stability", "--dim", "x"], ["argument --dim", "got x"]),
        (["stability", "--beta-max", "3"], ["argument --beta-max", "[0, 2]", "got 3"]),
        (["stability", "gdn", "--plot", "out.xyz"], ["argument --plot", ".png", "'out.xyz'"]),
        (["stability", "gdn", "--plot", "no/such/folder/out.png"], ["argument --plot", "existing folder"]),
        (["stability", "--checkpoint", "no-such.pt"], ["argument --checkpoint", "'no-such.pt'"]),
        (["stability", "--draws", "0", "--restarts", "0"], ["argument --draws", "--draws 0"]),
        (["coord-check", "foo"], ["linrnn coord-check:", "argument cell", "'foo'"]),
        (["coord-check", "gdn", "--param", "foo"], ["argument --param", "'foo'", "gdn-mup"]),
        (["coord-check", "gdn", "--widths", "64"], ["argument --widths", "at least two distinct widths", "[64]"]),
        (["coord-check", "gdn", "--widths", "64", "64"], ["argument --widths", "[64, 64]"]),
        (["coord-check", "gdn", "--widths", "63", "128"], ["argument --widths", "got 63"]),
        (["coord-check", "gdn", "--base-width", "6"], ["argument --base-width", "got 6"]),
        (["coord-check", "gdn", "--plot", "coords.xyz"], ["argument --plot", "'coords.xyz'"]),
        (["presets", "--cell", "foo"], ["linrnn presets:", "argument --cell", "'foo'"]),
        (["foo"], ["linrnn:", "invalid choice: 'foo'"]),
    ],
)
def test_one_line_before_computation(capsys, no_computation, argv, named):
    line = error_line(capsys, argv)
    for text in named:
        assert text in line, line


def test_sweep_arguments(capsys):
    pytest.importorskip("torchtitan")
    line = error_line(capsys, ["sweep", "--params", "umup"])
    assert "argument --params" in line and "'umup'" in line
    line = error_line(capsys, ["sweep", "--widths", "32", "64", "--base-width", "48"])
    assert "base_width" in line and "48" in line
    args = build_parser().parse_args(["sweep", "--params", "gdnmup", "sp"])
    assert args.params == ["gdn-mup", "sp"]


def test_debug_shows_the_traceback(no_computation):
    with pytest.raises(UsageError, match=r"argument --widths: expected at least two distinct widths, got \[64\]"):
        main(["--debug", "coord-check", "gdn", "--widths", "64"])
    with pytest.raises(UsageError, match="argument --widths"):  # --debug after the command works too
        main(["coord-check", "gdn", "--widths", "64", "--debug"])


def test_unexpected_errors_keep_their_traceback(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(stability_command, "check", broken)
    with pytest.raises(RuntimeError, match="a bug"):
        main(["stability", "gdn"])


@pytest.fixture
def checkpoint_files(tmp_path):
    corrupt, foreign, text = tmp_path / "corrupt.pt", tmp_path / "foreign.pt", tmp_path / "notes.pt"
    corrupt.write_bytes(os.urandom(4096))
    torch.save({"weights": torch.zeros(2)}, foreign)
    text.write_text("not a checkpoint\n")
    return corrupt, foreign, text


def test_load_checkpoint_refuses_other_files(tmp_path, checkpoint_files):
    corrupt, foreign, text = checkpoint_files
    for path in (corrupt, text):
        with pytest.raises(UsageError, match="is not a linrnn checkpoint: expected a zip archive") as caught:
            load_checkpoint(path)
        assert str(path) in str(caught.value)
    with pytest.raises(
        UsageError, match=r"not a linrnn checkpoint: .*keys \['config', 'model'\], got keys \['weights'\]"
    ):
        load_checkpoint(foreign)
    broken = tmp_path / "broken.pt"  # a torch zip archive with a truncated body
    save_checkpoint(linrnn.build_model("gdn"), broken)
    broken.write_bytes(broken.read_bytes()[:2000])
    with pytest.raises(UsageError, match="not a linrnn checkpoint"):
        load_checkpoint(broken)
    with pytest.raises(FileNotFoundError):
        load_checkpoint(tmp_path / "missing.pt")


def test_stability_checkpoint_error_is_one_line(capsys, no_computation, checkpoint_files):
    for path in checkpoint_files:
        line = error_line(capsys, ["stability", "--checkpoint", str(path)])
        assert "argument --checkpoint" in line and str(path) in line and "not a linrnn checkpoint" in line


def test_generate_checks_the_prompt():
    model = linrnn.build_model("gdn")
    with pytest.raises(UsageError, match=r"'prompt_ids' must hold at least one token, got shape \[0\]"):
        linrnn.generate(model, torch.tensor([], dtype=torch.long), 5)
    with pytest.raises(UsageError, match=r"'prompt_ids'.*got shape \[2, 0\]"):
        linrnn.generate(model, torch.zeros(2, 0, dtype=torch.long), 5)
    with pytest.raises(UsageError, match=r"'prompt_ids': expected token ids in \[0, vocab_size = 256\), got 256"):
        linrnn.generate(model, torch.tensor([72, 256]), 5)
    with pytest.raises(UsageError, match=r"'prompt_ids': expected token ids in \[0, vocab_size = 256\), got -1"):
        linrnn.generate(model, torch.tensor([[-1, 3]]), 5)
    with pytest.raises(UsageError, match="'prompt_ids' must be an integer tensor"):
        linrnn.generate(model, torch.tensor([1.0]), 5)
    assert linrnn.generate(model, torch.tensor([0, 255]), 3, temperature=0).shape == (5,)


def test_one_spelling_per_name_and_aliases(capsys):
    assert parametrizations.get("gdnmup").name == parametrizations.get("gdn_mup").name == "gdn-mup"
    with pytest.raises(ValueError, match="alias"):
        parametrizations.register(type("Variant", (parametrizations.Parametrization,), {"name": "gdnmup"})())
    assert model_config("gdn") == model_config("gdn", "byte-tiny")
    assert model_config("gdn", "paper256") == model_config("gdn", "paper-256")
    # one table of sizes: "tiny" is the model linrnn train --size tiny trains, the training sizes are presets
    tiny = model_config("gdn", "tiny")
    assert (tiny.vocab_size, tiny.hidden_size, tiny.num_layers, tiny.intermediate_size) == (4096, 128, 4, 512)
    assert linrnn.list_presets()[:2] == ["byte-tiny", "tiny"] and "paper256" not in linrnn.list_presets()
    assert list(names.SIZES) == [size for size in linrnn.list_presets() if size != "byte-tiny"]
    assert names.SIZE_ALIASES is PRESET_ALIASES and names.PARAMETRIZATION_ALIASES is parametrizations.ALIASES
    assert names.canonical_training_size("paper256") == "paper-256"
    with pytest.raises(UsageError, match=r"argument 'size': expected one of tiny, paper-256, .*, got 'byte-tiny'"):
        names.canonical_training_size("byte-tiny")
    assert main(["presets"]) == 0
    listed = capsys.readouterr().out
    assert "byte-tiny" in listed and "│ tiny" in listed


def test_demo_save_to_an_existing_file(capsys, monkeypatch, tmp_path):
    """``linrnn demo --save FILE``: one line and exit 2 before any training; the file stays as it was."""
    from linrnn.cli import demo as demo_command

    def forbidden(*args, **kwargs):
        raise AssertionError("the demo trained before --save was checked")

    monkeypatch.setattr(demo_command, "run_cell", forbidden)
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    line = error_line(capsys, ["demo", "--cells", "gdn", "--steps", "1", "--save", str(notes)])
    assert "linrnn demo: argument --save" in line and "existing file" in line and str(notes) in line, line
    assert notes.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == [notes]


def test_demo_save_below_a_file(capsys, monkeypatch, tmp_path):
    """A --save folder whose missing parents cannot be made (one of them is a file): one line, exit 2, nothing
    written. Missing parents themselves are allowed, as before: they are created with the first checkpoint."""
    from linrnn.cli import build_parser
    from linrnn.cli import demo as demo_command

    def forbidden(*args, **kwargs):
        raise AssertionError("the demo trained before --save was checked")

    monkeypatch.setattr(demo_command, "run_cell", forbidden)
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    below = notes / "models" / "run1"
    line = error_line(capsys, ["demo", "--cells", "gdn", "--steps", "1", "--save", str(below)])
    assert "linrnn demo: argument --save" in line and str(below) in line and f"'{notes}' is a file" in line, line
    assert notes.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == [notes]
    missing = tmp_path / "new" / "models"  # accepted, and the check itself creates nothing
    demo_command.check_arguments(build_parser().parse_args(["demo", "--save", str(missing)]))
    assert sorted(tmp_path.iterdir()) == [notes]


def test_unwritable_folders_are_found_before_anything_runs(tmp_path):
    """``arguments.unwritable``: tried with a real file, since root ignores permission bits (these tests run as
    root in CI too): a path below a regular file, and /proc, where nobody can create files."""
    from linrnn.cli.arguments import unwritable

    notes = tmp_path / "notes.txt"
    notes.write_text("x")
    assert unwritable(tmp_path) is None and unwritable(tmp_path / "new" / "run") is None  # made later: fine
    assert unwritable(notes / "run") == f"{notes} is not a folder"
    assert "cannot create a file in /proc" in unwritable("/proc/linrnn-run")
    assert sorted(tmp_path.iterdir()) == [notes]  # the probe leaves nothing behind
    if os.geteuid() != 0:  # as root, a read-only folder is writable (and the check says so)
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        assert "cannot create a file in" in unwritable(locked / "run")


@pytest.mark.parametrize(
    "argv",
    [
        ["stability", "gla", "--plot", "/proc/growth.png"],
        ["coord-check", "gdn", "--plot", "/proc/coords.png"],
        ["train", "--out", "/proc/linrnn-run"],
    ],
    ids=["stability", "coord-check", "train"],
)
def test_unwritable_outputs_are_one_line_before_computation(capsys, no_computation, argv):
    line = error_line(capsys, argv)
    assert "writ" in line and "/proc" in line and "cannot create a file in /proc" in line, line


def test_train_out_below_a_file(capsys, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("keep me\n")
    line = error_line(capsys, ["train", "--out", str(notes / "run")])
    assert "linrnn train: argument --out" in line and f"{notes} is not a folder" in line, line
    assert notes.read_text() == "keep me\n" and sorted(tmp_path.iterdir()) == [notes]


def test_ctrl_c_is_one_line(capsys, monkeypatch):
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(stability_command, "check", interrupted)
    assert main(["stability", "gla"]) == 130
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["linrnn stability: interrupted"], err


def test_load_checkpoint_is_exported():
    """The README names ``linrnn.load_checkpoint``."""
    assert linrnn.load_checkpoint is load_checkpoint and "load_checkpoint" in linrnn.__all__


def test_train_help_names_cells_as_linrnn_cells_does():
    """``linrnn train --help`` lists the mixers under the names of ``linrnn cells`` (a config name in brackets)."""
    text = " ".join(build_parser()._subparsers._group_actions[0].choices["train"].format_help().split())
    assert "gated_deltanet (gdn)" in text
    for name in linrnn.list_mixers():
        assert name in text, name


def test_sweep_of_one_width_is_refused(capsys):
    pytest.importorskip("torchtitan")
    line = error_line(capsys, ["sweep", "--widths", "64", "--table", "/nonexistent/sweep.jsonl"])
    assert "argument --widths" in line and "at least two widths" in line and "[64]" in line, line


def test_coord_check_plot_legend_fits(tmp_path, monkeypatch):
    """One legend entry per kind of output (not one per output and layer: 92 for GDN), outside the panels and
    saved whole."""
    import matplotlib.pyplot as plt
    import numpy as np

    from linrnn.parametrizations.coord_check import CoordCheck

    names = ["embed", "norm", "logits"] + [f"layers.{i}.{part}" for i in range(4) for part in
                                           ("mixer.q_proj", "mixer", "mlp.up_proj", "mixer:beta")]  # fmt: skip
    check = CoordCheck("gdn", "mup", "adamw", 1e-3, [64, 128], 1)
    check.sizes = {name: np.ones((2, 2)) for name in names} | {f"Δ {name}": np.ones((2, 2)) for name in names}
    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda figure=None: figures.append(figure) or close(figure))
    check.plot(tmp_path / "coords.png")
    labels = [text.get_text() for text in figures[0].legends[0].get_texts()]
    assert labels[:-2] == ["embed", "norm", "logits", "mixer.q_proj", "mixer", "mlp.up_proj", "mixer:beta"]
    assert (tmp_path / "coords.png").stat().st_size > 0


def test_sweep_estimates_its_time_from_measured_rates(tmp_path):
    """Before training, ``linrnn sweep`` says how long the runs to go should take: from the table's runs of these
    settings on this kind of device where it has some, else from linrnn's measured rates."""
    pytest.importorskip("torchtitan")
    import json

    from linrnn.cli.sweep import config_from_args, estimate_line
    from linrnn.training.sweep import pending

    table = tmp_path / "sweep.jsonl"
    argv = ["sweep", "--widths", "32", "64", "--layers", "2", "--heads", "2", "--seq-len", "64", "--steps", "20",
            "--optimizers", "adamw", "--adamw-lrs", "1e-3", "--params", "sp", "--table", str(table)]  # fmt: skip
    config = config_from_args(build_parser().parse_args(argv))
    todo = list(pending(config, table))
    line = estimate_line(config, todo, table, "cpu")
    assert line.startswith("estimate: 2 runs ≈ ") and "measured on 2 CPU cores" in line, line
    key = todo[0].key(config.settings_hash())  # a run of width 64 at 100 tokens/s: 40,960 tokens take 7 min
    table.write_text(json.dumps({**todo[0].model_dump(), "key": key, "device": "cpu", "tokens_per_second": 100}) + "\n")
    line = estimate_line(config, todo, table, "cpu")
    assert "the table's runs on this device" in line and "2 runs ≈ 7 min" in line, line
    assert "the table's runs" not in estimate_line(config, todo, table, "cuda")
