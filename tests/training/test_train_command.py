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


# Checked before anything is written, in this process (no training): the data, torchtitan's flags, Ctrl-C's line.


def linrnn_train_here(capsys, *args: str) -> tuple[int, str, str]:
    """``linrnn train args`` in this process: (exit status, stdout, stderr)."""
    from linrnn.cli import main

    code = main(["train", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_too_little_text_for_a_batch_is_one_line_before_anything_is_written(corpus, tmp_path, capsys):
    """Twelve short documents: neither split fills one batch of 16 windows of 256 tokens; said per split, before
    training (it used to fail with a traceback after step 1, at the first validation)."""
    folder = tmp_path / "docs"
    folder.mkdir()
    for i in range(12):
        (folder / f"{i:02}.txt").write_text(f"Document {i}. " + "A few plain words, and then a few more. " * 20)
    code, out, err = linrnn_train_here(capsys, "--data", str(folder), "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "argument --data: one batch of 16 windows of 256 tokens needs 4,097 tokens in each split" in err
    assert "the training split has" in err and "the held-out split has" in err and "(1 of the 12 documents)" in err
    assert not (tmp_path / "run").exists()


def test_split_sizes_say_what_fits():
    from linrnn.errors import UsageError
    from linrnn.training.job import check_split_sizes

    stats = {"train_tokens": 99_000, "train_documents": 25, "validation_tokens": 2_732, "validation_documents": 2}
    check_split_sizes(stats, seq_len=256, batch=10)  # 10 windows of the held-out 2,734 tokens: enough
    with pytest.raises(UsageError) as caught:
        check_split_sizes(stats, seq_len=256, batch=16)
    message = str(caught.value)
    assert "needs 4,097 tokens in each split; the held-out split has 2,734 (2 of the 27 documents)" in message
    assert "training split" not in message and "--training.local_batch_size 10" in message
    check_split_sizes(stats, seq_len=256, batch=16, validation=False)  # no validation during training
    with pytest.raises(UsageError, match="--training.seq_len 170"):
        check_split_sizes(stats, seq_len=4096, batch=16)


def test_text_that_is_not_utf8_is_one_line(corpus, tmp_path, capsys):
    from linrnn.training import data

    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "a.txt").write_text("plain text\n")
    (folder / "b.txt").write_bytes("Il était une fois un café.\n".encode("latin-1"))
    with pytest.raises(ValueError, match=rf"{folder / 'b.txt'} is not UTF-8 text \(byte 0xe9 at offset 3\)"):
        data.load_text_files(str(folder))
    code, _, err = linrnn_train_here(capsys, "--data", str(folder), "--out", str(tmp_path / "run"))
    assert code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "argument --data" in err and str(folder / "b.txt") in err and "offset 3" in err
    assert not (tmp_path / "run").exists()


def test_local_files_load_without_progress_bars(tmp_path, capfd):
    from linrnn.training import data

    (tmp_path / "a.txt").write_text("some text\n")
    assert data.load_text_files(str(tmp_path))["text"] == ["some text\n"]
    captured = capfd.readouterr()
    assert "Downloading" not in captured.err + captured.out and "Generating" not in captured.err + captured.out


def test_a_mistyped_torchtitan_flag_writes_nothing(corpus, tmp_path, capsys):
    """torchtitan's parser refuses the flag before the manifest is written: the plain command then starts the run
    (it used to be refused as "another run", the mistyped one's manifest being in the folder)."""
    code, _, err = linrnn_train_here(capsys, "--out", str(tmp_path / "run"), "--", "--trainig.steps", "3")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "torchtitan flags: Unrecognized options: --trainig.steps" in err, err
    assert "perhaps you meant --training.steps" in err, err
    assert not (tmp_path / "run").exists()
    code, _, err = linrnn_train_here(capsys, "--out", str(tmp_path / "run"), "--", "--training.seq_len", "x")
    assert code == 2 and "torchtitan flags: Error parsing --training.seq" in err and "'x'" in err, err


def test_ctrl_c_says_where_it_stopped_and_how_to_resume(corpus, tmp_path, capsys, monkeypatch):
    """Training interrupted after step 4, the checkpoint of step 4 cut short: one line naming the step, the run
    folder, the checkpoint it resumes from and the command (without --fresh); exit status 130. An estimate of the
    training time came before."""
    from linrnn.cli import train as train_command
    from linrnn.training import launch

    out = tmp_path / "run"

    def interrupted(flags):
        (out / "checkpoint" / "step-2").mkdir(parents=True)
        (out / "checkpoint" / "step-2" / ".metadata").write_bytes(b"")
        (out / "checkpoint" / "step-4").mkdir()  # being written when Ctrl-C came: no .metadata
        monkeypatch.setattr(launch, "finished_step", 4)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_command, "run_trainer", interrupted)
    code, stdout, err = linrnn_train_here(capsys, "--steps", "5", "--out", str(out), "--fresh", *SMALL)
    assert code == 130, err
    assert "estimate: 5 steps × 128 tokens = 640 tokens at about" in stdout, stdout
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    resume = (f"linrnn train --cell gdn --size tiny --param sp --steps 5 --out {out} -- --training.local_batch_size 2 "
              f"--training.seq_len 64 --validator.steps 2")  # fmt: skip
    assert lines[0] == (f"linrnn train: stopped after step 4 of 5 (Ctrl-C); run folder {out} keeps the checkpoint of "
                        f"step 2; resume with: {resume}")  # fmt: skip


def test_estimates_rest_on_measured_rates():
    from linrnn.models.config import model_config
    from linrnn.training import job
    from linrnn.training.names import SIZES

    tiny = job.estimate(model_config("gated_deltanet", "tiny", **SIZES["tiny"].overrides), 250 * 4096, "cpu")
    assert tiny.rate == 2_300 and tiny.basis == "measured for this model on 2 CPU cores"
    assert tiny.describe() == "1.0M tokens at about 2,300 tokens/s: 7 min"
    large = job.estimate(model_config("gated_deltanet", "340m", **SIZES["340m"].overrides), 250 * 16384, "cpu")
    assert large.seconds > 86400 and "scaled by FLOPs per token" in large.basis  # days: said before it starts
    assert [job.duration(s) for s in (5, 600, 7200, 3 * 86400)] == ["5 s", "10 min", "2.0 h", "3.0 days"]


def test_run_folders_keep_no_empty_comm_traces(tmp_path, monkeypatch):
    """torchtitan makes ``comm_traces/`` for the NCCL flight recorder's dumps on a timeout: removed when empty,
    after a run and after Ctrl-C, kept when it holds a dump."""
    import torchtitan.train

    from linrnn.training import compat, launch, logs

    compat.install()
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "0" if key != "MASTER_ADDR" else "127.0.0.1")
    monkeypatch.setattr(sys, "argv", list(sys.argv))

    def run_with_traces(dump: bool = False, interrupt: bool = False):
        logs.write_to(str(tmp_path))  # as LinrnnMetrics does
        (tmp_path / "comm_traces").mkdir()
        if dump:
            (tmp_path / "comm_traces" / "rank_0").write_text("dump")
        if interrupt:
            raise KeyboardInterrupt

    monkeypatch.setattr(torchtitan.train, "main", run_with_traces)
    launch.run_trainer(["--config", "gdn_tiny_sp"])
    assert not (tmp_path / "comm_traces").exists()
    monkeypatch.setattr(torchtitan.train, "main", lambda: run_with_traces(interrupt=True))
    with pytest.raises(KeyboardInterrupt):
        launch.run_trainer(["--config", "gdn_tiny_sp"])
    assert not (tmp_path / "comm_traces").exists()
    monkeypatch.setattr(torchtitan.train, "main", lambda: run_with_traces(dump=True))
    launch.run_trainer(["--config", "gdn_tiny_sp"])
    assert (tmp_path / "comm_traces" / "rank_0").exists()


def test_resuming_the_lr_schedule_warns_nothing():
    """torchtitan's scheduler load_state_dict called get_lr() outside step(): torch's UserWarning on every resume
    (linrnn.training.compat marks the call as within a step). The learning rate is unchanged."""
    import warnings

    import torch

    from linrnn.training import compat

    compat.install()
    from torchtitan.components.optimizer import LRSchedulersContainer

    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    config = LRSchedulersContainer.Config(warmup_steps=2, decay_type="cosine", min_lr_factor=0.1)
    schedulers = config.build(optimizers=[optimizer], training_steps=10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedulers.load_state_dict({"last_epoch": 3})
    assert [str(w.message) for w in caught] == []
    reference_optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    reference = config.build(optimizers=[reference_optimizer], training_steps=10)
    for _ in range(3):
        reference_optimizer.step()
        reference.step()
    assert schedulers.schedulers[0].get_last_lr() == pytest.approx(reference.schedulers[0].get_last_lr())
