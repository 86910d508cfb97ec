"""``linrnn train`` as a user meets it: run folders that resume only into the same run, a finished run reported
as finished, your own data and tokenizer end to end, folders linrnn did not write refused unread, one-line errors.
Each run is a subprocess (torchtitan initialises a process group), 3 steps of the tiny model on CPU."""

from __future__ import annotations

import json
import os
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

SMALL = ["--", "--training.local_batch_size", "2", "--training.seq_len", "64", "--validator.steps", "2"]


def linrnn_train(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[2])}
    command = [sys.executable, "-m", "linrnn", "train", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=600)


def one_line_error(done: subprocess.CompletedProcess, *words: str) -> None:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert all(word in lines[0] for word in words), lines[0]


def folder_contents(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def finished_run(corpus, tmp_path_factory):
    """A 3-step GDN run on the embedded corpus: (its folder, the finished process)."""
    out = tmp_path_factory.mktemp("runs") / "gdn"
    done = linrnn_train("--steps", "3", "--out", str(out), *SMALL)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    return out, done


def test_a_run_writes_its_manifest_model_tokenizer_and_curve(finished_run):
    out, done = finished_run
    assert "Warning" not in done.stdout + done.stderr  # e.g. the checkpoint reader's one-process notice
    manifest = json.loads((out / "linrnn-run.json").read_text())
    assert manifest["identity"]["config"] == "gdn_tiny_sp" and manifest["steps"] == 3
    assert set(manifest["result"]) == {"bpb", "token_unigram_bpb"}
    for name in ("model.pt", "tokenizer/tokenizer.json", "training_curve.png", "checkpoint/step-3"):
        assert (out / name).exists(), name


def test_below_the_baseline_says_why_it_exits_nonzero(finished_run):
    """Three steps do not beat the token unigram baseline: exit 1, and stderr says so."""
    out, done = finished_run
    result = json.loads((out / "linrnn-run.json").read_text())["result"]
    assert result["bpb"] >= result["token_unigram_bpb"]
    assert done.returncode == 1 and "does not beat the token unigram baseline" in done.stderr


def test_a_finished_run_is_reported_not_retrained(finished_run):
    out, _ = finished_run
    before = folder_contents(out)
    done = linrnn_train("--steps", "3", "--out", str(out), *SMALL)
    assert "is finished: 3 steps" in done.stdout and "trained" not in done.stdout
    assert folder_contents(out) == before


def test_another_cell_in_the_folder_is_refused_and_nothing_changes(finished_run):
    out, _ = finished_run
    before = folder_contents(out)
    one_line_error(
        linrnn_train("--cell", "kda", "--steps", "3", "--out", str(out), *SMALL), "gdn_tiny_sp", "kda_tiny_sp"
    )
    assert folder_contents(out) == before


class _CreatesFile:
    """Unpickling this creates a file: the proof that a pickle was loaded."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_folder_without_manifest_is_refused_unread(tmp_path):
    """A checkpoint folder planted with a pickle in .metadata, no manifest: refused before anything is loaded."""
    marker = tmp_path / "unpickled"
    step = tmp_path / "run" / "checkpoint" / "step-10"
    step.mkdir(parents=True)
    (step / ".metadata").write_bytes(pickle.dumps(_CreatesFile(marker)))
    pickle.loads((step / ".metadata").read_bytes()).close()  # the planted pickle does create the file
    assert marker.exists()
    marker.unlink()
    one_line_error(linrnn_train("--steps", "1", "--out", str(tmp_path / "run")), "--out", "linrnn-run.json")
    assert not marker.exists()


def test_fresh_starts_over(finished_run, tmp_path):
    """--fresh in a copy of the finished folder: trained again from step 1, the old outputs gone."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(finished_run[0], out)
    (out / "checkpoint" / "step-2").mkdir()  # an old checkpoint that must not survive
    done = linrnn_train("--cell", "kda", "--steps", "2", "--out", str(out), "--fresh", *SMALL)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert "trained kda_tiny_sp to step 2 (2 steps)" in done.stdout
    assert json.loads((out / "linrnn-run.json").read_text())["identity"]["config"] == "kda_tiny_sp"
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["step-2"]


def test_more_steps_resume_the_run(finished_run, tmp_path):
    """--steps above a finished run's: resumed from its last checkpoint, and said so."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(finished_run[0], out)
    done = linrnn_train("--steps", "4", "--out", str(out), *SMALL)
    assert done.returncode in (0, 1), done.stderr[-3000:]
    assert f"resuming gdn_tiny_sp at step 3 from {out}" in done.stdout
    assert "trained gdn_tiny_sp to step 4 (1 step)" in done.stdout
    assert sorted(p.name for p in (out / "checkpoint").iterdir()) == ["step-3", "step-4"]


def test_own_data_and_tokenizer_end_to_end(corpus, tmp_path):
    """--data and --tokenizer: the final bits per byte are the run's model on the held-out tenth of the user's
    documents with the user's tokenizer, the training bpb uses their bytes per token, the tokenizer is saved."""
    from linrnn.models import load_checkpoint
    from linrnn.training import data
    from linrnn.training.job import validation_bpb

    rng = random.Random(0)
    words = [rng.choice("abcdefghij") * rng.randint(1, 4) + rng.choice("klmnop") for _ in range(50)]
    documents = ["\n".join(" ".join(rng.choices(words, k=12)) for _ in range(25)) for _ in range(20)]
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in documents))
    tokenizer = tmp_path / "tokenizer"
    data._train_tokenizer(documents, 300, tokenizer)
    out = tmp_path / "run"
    args = ["--data", str(tmp_path / "docs.jsonl"), "--tokenizer", str(tokenizer)]
    done = linrnn_train("--steps", "3", "--out", str(out), *args, *SMALL)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "tokenizer" / "tokenizer.json").read_bytes() == (tokenizer / "tokenizer.json").read_bytes()
    train_texts, held_out = data.held_out_split(documents)
    assert held_out == documents[9::10]
    expected = validation_bpb(load_checkpoint(out / "model.pt"), tokenizer, held_out)
    result = json.loads((out / "linrnn-run.json").read_text())["result"]
    assert result["bpb"] == pytest.approx(expected, rel=1e-6)
    stats = data.text_stats(tokenizer, train_texts, held_out)
    assert result["token_unigram_bpb"] == pytest.approx(stats["token_unigram_bpb"])
    assert f"{expected:.3f} bits per byte" in done.stdout and str(tmp_path / "docs.jsonl") in done.stdout
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in records if "loss" in r)
    assert first["bpb"] == pytest.approx(first["loss"] / 0.6931471805599453 / stats["bytes_per_token"])
    assert any(r.get("validation_bpb") is not None for r in records)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--param", "foo"], ["--param", "foo", "gdn-mup"]),
        (["--cell", "transformer"], ["--cell", "transformer"]),
        (["--size", "huge"], ["--size", "huge", "tiny, paper-256", "1.3b"]),
        (["--steps", "0"], ["--steps", "0"]),
        (["--", "--hf_assets_path", "/tmp/x"], ["--hf_assets_path", "--tokenizer"]),
        (["--data", "/nonexistent/docs"], ["--data", "/nonexistent/docs"]),
        (["--tokenizer", "/nonexistent/tok"], ["--tokenizer", "/nonexistent/tok"]),
    ],
    ids=["param", "cell", "size", "steps", "data_flag_override", "data", "tokenizer"],
)
def test_bad_arguments_are_one_line_errors(corpus, tmp_path, args, words):
    one_line_error(linrnn_train("--out", str(tmp_path / "run"), *args), *words)
    assert not (tmp_path / "run").exists()


def test_old_spellings_are_accepted(corpus):
    from linrnn.training import configs

    assert configs.canonical_config_name("gammanet_paper256_gdnmup") == "gammanet_paper-256_gdn-mup"
    assert configs.gammanet_tiny_gdnmup is getattr(configs, "gammanet_tiny_gdn-mup")
