"""``linrnn eval mqar``: the MQAR generator's layout (zoology's ``multiquery_ar``), the accuracy at chance for a
predictor that cannot see the context, the best-learning-rate summary, the command end to end on the CPU (JSON
rows, plot, resume) and its refusals of bad input."""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest
import torch

from linrnn.cli import main
from linrnn.evaluation import mqar, mqar_task
from linrnn.evaluation.mqar_report import best_lr
from linrnn.evaluation.mqar_task import (
    IGNORE_INDEX,
    MQARSettings,
    chance_accuracy,
    evaluate,
    held_out_set,
    multiquery_ar,
    train_stream,
)


def generate(num_examples: int, seq_len: int, num_pairs: int, vocab_size: int, seed: int = 0, power_a: float = 0.01):
    return multiquery_ar(num_examples, seq_len, num_pairs, vocab_size, torch.Generator().manual_seed(seed), power_a)


def test_layout():
    """Pairs first (distinct keys from the lower half of the vocabulary, distinct values from the upper half), then
    each key queried once, at an even offset after the pairs, labelled with its value; no other labels."""
    n, seq_len, pairs, vocab = 300, 64, 8, 64
    inputs, labels = generate(n, seq_len, pairs, vocab)
    assert inputs.shape == labels.shape == (n, seq_len) and inputs.dtype == labels.dtype == torch.long
    assert 0 <= int(inputs.min()) and int(inputs.max()) < vocab
    keys, values = inputs[:, 0 : 2 * pairs : 2], inputs[:, 1 : 2 * pairs : 2]
    assert ((keys >= 1) & (keys < vocab // 2)).all() and ((values >= vocab // 2) & (values < vocab)).all()
    assert (labels[:, : 2 * pairs] == IGNORE_INDEX).all()
    for row in range(n):
        assert len(set(keys[row].tolist())) == pairs and len(set(values[row].tolist())) == pairs
        positions = (labels[row] != IGNORE_INDEX).nonzero().squeeze(1)
        assert len(positions) == pairs and ((positions - 2 * pairs) % 2 == 0).all()
        answer = dict(zip(keys[row].tolist(), values[row].tolist(), strict=True))
        queried = inputs[row, positions].tolist()
        assert sorted(queried) == sorted(answer)  # every key exactly once
        for position, key in zip(positions.tolist(), queried, strict=True):
            pair = keys[row].tolist().index(key)
            assert position > 2 * pair + 1  # after its pair
            assert labels[row, position] == answer[key]


def test_power_law_slots():
    """With one pair, the query's slot g is drawn with probability ∝ (g + 1)^(a − 1): every slot's frequency within
    5 standard errors; with several pairs the slots are distinct and the near ones the most frequent."""
    n, pairs, space, a = 20000, 1, 20, 0.3
    _, labels = generate(n, 2 * pairs + 2 * space, pairs, 16, power_a=a)
    slots = ((labels != IGNORE_INDEX).nonzero()[:, 1] - 2 * pairs) // 2
    frequency = torch.bincount(slots, minlength=space).double() / n
    p = torch.arange(1, space + 1, dtype=torch.float64) ** (a - 1)
    p /= p.sum()
    assert ((frequency - p).abs() <= 5 * (p * (1 - p) / n).sqrt()).all(), (frequency, p)

    pairs = 4
    _, labels = generate(5000, 2 * pairs + 2 * space, pairs, 64)
    slots = ((labels != IGNORE_INDEX).nonzero()[:, 1] - 2 * pairs) // 2
    counts = torch.bincount(slots, minlength=space)
    assert counts.sum() == 5000 * pairs  # distinct slots: one label each
    assert counts[:4].min() > 2 * counts[-4:].max()


def test_seeds():
    """A seed gives the same examples; training streams differ by seed and from the held-out set."""
    first, again = generate(50, 32, 4, 32, seed=3), generate(50, 32, 4, 32, seed=3)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    settings = MQARSettings(seq_len=32, num_pairs=4, vocab_size=32, batch_size=200, test_examples=200)
    test_inputs, _ = held_out_set(settings)
    assert torch.equal(test_inputs, held_out_set(settings)[0])
    stream = train_stream(settings, seed=0)
    batches = [stream()[0], stream()[0], train_stream(settings, seed=1)()[0]]
    assert torch.equal(batches[0], train_stream(settings, seed=0)()[0])
    rows = lambda x: {tuple(row) for row in x.tolist()}  # noqa: E731
    for batch in batches:
        assert not rows(batch) & rows(test_inputs)
    assert not rows(batches[0]) & rows(batches[1]) and not rows(batches[0]) & rows(batches[2])


def test_accuracy_at_chance_without_context():
    """A predictor that sees only the current token (a fixed random value per token) scores 1 / (number of values)
    within 5 binomial standard errors; one that reads the pairs scores 1."""
    vocab, pairs = 64, 4
    inputs, labels = generate(2000, 64, pairs, vocab, seed=1)
    guess = torch.randint(vocab // 2, vocab, (vocab,), generator=torch.Generator().manual_seed(5))
    one_hot = lambda values: torch.nn.functional.one_hot(values, vocab).float()  # noqa: E731
    blind = lambda x, positions: one_hot(guess[x.gather(1, positions)])  # noqa: E731
    accuracy, _ = evaluate(blind, inputs, labels, batch_size=256)
    p, queries = chance_accuracy(vocab), 2000 * pairs
    assert p == 1 / 32
    assert abs(accuracy - p) <= 5 * math.sqrt(p * (1 - p) / queries), accuracy

    def oracle(x, positions):
        table = torch.zeros(len(x), vocab, dtype=torch.long)  # key → value per example
        table.scatter_(1, x[:, 0 : 2 * pairs : 2], x[:, 1 : 2 * pairs : 2])
        return one_hot(table.gather(1, x.gather(1, positions)))

    assert evaluate(oracle, inputs, labels, batch_size=256)[0] == 1.0


def test_best_lr():
    """The best learning rate by the mean over seeds (not the best single seed), its seed range; diverged runs
    count as 0; a tie goes to the smaller learning rate."""

    def row(cell, width, lr, seed, accuracy):
        return dict(cell=cell, width=width, lr=lr, seed=seed, accuracy=accuracy, parameters=width * 10)

    rows = [
        row("gdn", 32, 1e-3, 0, 0.9), row("gdn", 32, 1e-3, 1, 0.1),  # mean 0.5, best seed 0.9
        row("gdn", 32, 1e-2, 0, 0.6), row("gdn", 32, 1e-2, 1, 0.7),  # mean 0.65
        row("gdn", 16, 1e-3, 0, 0.3), row("gdn", 16, 1e-2, 0, 0.3),  # tie
        row("gla", 32, 1e-3, 0, 0.4), row("gla", 32, 1e-2, 0, 0.0),  # 0.0: diverged
    ]  # fmt: skip
    summary = best_lr(rows)
    assert [(s["cell"], s["width"]) for s in summary] == [("gdn", 16), ("gdn", 32), ("gla", 32)]
    gdn16, gdn32, gla32 = summary
    assert gdn32["lr"] == 1e-2 and gdn32["mean"] == pytest.approx(0.65)
    assert (gdn32["min"], gdn32["max"], gdn32["seeds"]) == (0.6, 0.7, 2)
    assert gdn32["by_lr"] == pytest.approx({1e-3: 0.5, 1e-2: 0.65})
    assert gdn16["lr"] == 1e-3 and gla32["lr"] == 1e-3 and gla32["mean"] == 0.4


TINY = ["--seq-len", "16", "--pairs", "2", "--vocab", "16", "--layers", "1", "--steps", "3", "--batch-size", "4",
        "--test-examples", "8", "--device", "cpu", "--jobs", "1"]  # fmt: skip


def test_command(tmp_path, capsys):
    """A short sweep writes one JSON row per run and the plot; the same command again trains nothing; other
    settings on the same file are refused."""
    out = tmp_path / "results.json"
    argv = ["eval", "mqar", "--cells", "gdn", "--widths", "16,32", "--lrs", "3e-3,1e-2", "--seeds", "0,1", *TINY,
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    document = json.loads(out.read_text())
    assert document["settings"]["steps"] == 3 and document["chance_accuracy"] == 1 / 8
    runs = sorted((r["cell"], r["width"], r["lr"], r["seed"]) for r in document["rows"])
    assert runs == sorted(("gated_deltanet", w, lr, s) for w in (16, 32) for lr in (3e-3, 1e-2) for s in (0, 1))
    for r in document["rows"]:
        assert r["steps"] == 3 and 0 <= r["accuracy"] <= 1 and r["parameters"] > 0 and r["device"] == "cpu"
        assert math.isfinite(r["test_loss"]) and not r["diverged"]
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    printed = capsys.readouterr().out
    assert "[8/8] gated_deltanet" in printed and "best" in printed

    assert main(argv) == 0  # resumed: nothing left to train
    again = json.loads(out.read_text())
    assert again["rows"] == document["rows"] and len(again["invocations"]) == 2
    assert "0 to train" in capsys.readouterr().out

    other = [*argv[:-2], "--steps", "4", "--out", str(out)]
    assert main(other) == 2
    assert "steps 3 there, 4 here" in capsys.readouterr().err


def test_stopped_sweep_keeps_rows(tmp_path, monkeypatch, capsys):
    """Each finished run is in the JSON at once: a sweep stopped (Ctrl-C: one line, exit status 130) after one run
    keeps it, and the same command trains only the rest."""
    out = tmp_path / "results.json"
    argv = ["eval", "mqar", "--cells", "deltanet", "--widths", "16", "--seeds", "0,1", *TINY, "--out", str(out)]
    real = mqar.train_runs

    def stopped_after_one(*args):
        yield next(real(*args))
        raise KeyboardInterrupt

    monkeypatch.setattr(mqar, "train_runs", stopped_after_one)
    assert main(argv) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["linrnn eval mqar: interrupted"]
    (first,) = json.loads(out.read_text())["rows"]
    monkeypatch.setattr(mqar, "train_runs", real)
    assert main(argv) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and rows[0] == first


def test_worker_processes_give_the_same_rows():
    """Runs in two spawned worker processes give the rows of the same runs in this process (CPU, one thread)."""
    settings = MQARSettings(seq_len=16, num_pairs=2, vocab_size=16, num_layers=1, steps=3, batch_size=4,
                            test_examples=8)  # fmt: skip
    runs = [("gated_deltanet", 16, 1e-2, 0), ("gated_deltanet", 16, 1e-2, 1)]
    key = lambda row: (row["seed"], row["accuracy"], row["test_loss"], row["loss_curve"])  # noqa: E731
    here = sorted(map(key, mqar.train_runs(runs, settings, ["cpu"], 1)))
    assert sorted(map(key, mqar.train_runs(runs, settings, ["cpu"], 2))) == here


@pytest.fixture
def no_training(monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("training started before the arguments were checked")

    monkeypatch.setattr(mqar, "train_runs", forbidden)


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        (["--cells", "foo"], ["argument --cells", "'foo'", "fla-gdn"]),
        (["--cells", "gdn,gated_deltanet"], ["argument --cells", "distinct"]),
        (["--widths", "40", "--heads", "4"], ["argument --widths", "width 40", "--heads 4", "divisible"]),
        (["--widths", "32,0"], ["argument --widths", "got 0"]),
        (["--seeds", ""], ["argument --seeds", "comma-separated"]),
        (["--seeds", "0,,1"], ["argument --seeds", "'0,,1'"]),
        (["--lrs=1e-3,-1"], ["argument --lrs", "got -1"]),
        (["--steps", "0"], ["argument --steps", "got 0"]),
        (["--batch-size", "x"], ["argument --batch-size", "got x"]),
        (["--pairs", "5"], ["argument --pairs", "--seq-len 16", "got 5"]),
        (["--pairs", "8", "--seq-len", "64"], ["argument --pairs", "--vocab 16", "got 8"]),
        (["--out", "no/such/folder/r.json"], ["argument --out", "existing folder"]),
        (["--out", "results.txt"], ["argument --out", ".json"]),
        (["--device", "cuda:7"], ["argument --device", "'cuda:7'"]),
        (["--device", "tpu"], ["argument --device", "'tpu'"]),
        (["--cells", "fla-gdn", "--device", "cpu"], ["argument --cells", "fla-gdn"]),
    ],
)
def test_bad_input(arguments, named, capsys, no_training, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "mqar", *arguments]) == 2
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("linrnn eval mqar:")
    for part in named:
        assert part in lines[0], lines[0]


def test_out_of_another_kind(tmp_path, capsys, no_training):
    out = tmp_path / "other.json"
    out.write_text('{"something": "else"}')
    assert main(["eval", "mqar", "--out", str(out)]) == 2
    assert "argument --out" in capsys.readouterr().err and out.read_text() == '{"something": "else"}'


def test_fla_not_installed(capsys, no_training, monkeypatch):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *args: None if name == "fla" else find_spec(name, *args)
    )
    assert main(["eval", "mqar", "--cells", "gdn,fla-kda"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "argument --cells: fla-kda needs flash-linear-attention" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_out_not_writable(tmp_path, capsys, no_training):
    folder = tmp_path / "locked"
    folder.mkdir(mode=0o500)
    assert main(["eval", "mqar", "--out", str(folder / "r.json")]) == 2
    assert "writable folder" in capsys.readouterr().err


def test_fla_models_match_linrnn_shapes():
    """``fla-gdn`` is FLA's Gated DeltaNet at linrnn's shape: the same parameter count as linrnn's gdn model."""
    pytest.importorskip("fla.models")
    settings = MQARSettings()
    for width in (32, 64):
        fla, ours = (mqar_task.num_parameters(name, width, settings) for name in ("fla-gdn", "gated_deltanet"))
        assert fla == ours
