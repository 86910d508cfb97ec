"""The console of ``linrnn.train``: its own --help, a short run's few readable lines on CPU (torchtitan's chatter in
the run folder's torchtitan.log), and rank 0 alone printing progress."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchtitan")

ROOT = Path(__file__).parents[2]


def run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    env.pop("RANK", None)
    return subprocess.run([sys.executable, "-m", "linrnn.train", *args], capture_output=True, text=True, env=env,
                          timeout=300)  # fmt: skip


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_help_prints_usage_and_exits_0(flag):
    done = run(flag)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("usage: python -m linrnn.train --config NAME")
    assert "--list-configs" in done.stdout and "--training.steps" in done.stdout


def test_a_short_cpu_run_prints_a_few_honest_lines(corpus, tmp_path):
    """Before: 36 lines here, one of 2,306 characters (parameter names), MFU and memory fields, 7 warnings."""
    out = tmp_path / "run"
    small = ["--training.local_batch_size", "2", "--training.seq_len", "64", "--metrics.log_freq", "1"]
    done = run("--config", "gdn_tiny_sp", "--dump_folder", str(out), *small, "--training.steps", "3",
               "--validator.steps", "2", "--checkpoint.no-enable", "--lr_scheduler.warmup_steps", "1")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    console = done.stdout + done.stderr
    lines = console.splitlines()
    assert len(lines) <= 15, console
    assert max(map(len, lines)) <= 300, console
    assert "mfu" not in console.lower() and "memory" not in console.lower(), console
    assert "WARNING" not in console, console  # no peak-flops fallback, no false alarms (warmup fits the 3 steps)
    assert "validating on the held-out set (4 windows of 64 tokens, each read from a zero state)…" in console
    assert not (out / "comm_traces").exists()  # torchtitan's folder for NCCL timeout dumps: none, so removed
    progress = [line.split(" ", 1)[1] for line in lines if " loss " in line]  # without the time
    assert [p[: p.index("loss")].strip() for p in progress] == ["step 1", "validation at step 1:", "step 2", "step 3"]
    log = (out / "torchtitan.log").read_text()  # torchtitan's chatter, in full
    assert "Optimizer AdamW" in log and "step:  3" in log


@pytest.fixture
def root_logger():
    """Restores the root logger's handlers and level after a test that installs linrnn's."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    from linrnn.training import logs

    logs.close()
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize("rank", [0, 1])
def test_console_rank_filter(rank, root_logger, monkeypatch, tmp_path):
    """Rank 0 prints linrnn's lines, torchtitan's milestones and warnings; rank 1 only warnings and errors."""
    from linrnn.training import compat

    compat.install()
    from linrnn.training import logs

    monkeypatch.setenv("RANK", str(rank))
    console = io.StringIO()
    monkeypatch.setattr(sys, "stdout", console)
    logs.install()
    titan = logging.getLogger()  # torchtitan's logger is the root logger
    titan.info("Optimizer AdamW (model_part=0): 53 params [^(?:" + "model\\.layers\\.0\\.mixer\\.q_proj|" * 80)
    titan.info("\x1b[34mModel linrnn gdn_tiny_sp \x1b[31msize: 1,000 total parameters\x1b[39m")
    logs.log.info("step 1  loss 8.0000")
    titan.warning("initial_load_model_only=True has no effect without an initial_load_path.")
    titan.warning("Ran out of data; last step was canceled.")
    logs.write_to(str(tmp_path))
    printed = [line.split(" ", 1)[1] for line in console.getvalue().splitlines()]  # without the time
    if rank == 0:
        assert printed == [
            "Model linrnn gdn_tiny_sp size: 1,000 total parameters",
            "step 1  loss 8.0000",
            "WARNING Ran out of data; last step was canceled.",
            f"torchtitan's full log: {tmp_path / 'torchtitan.log'}",
        ]
        log = (tmp_path / "torchtitan.log").read_text()
        assert "Optimizer AdamW" in log and "initial_load_model_only" in log and "\x1b[" not in log
    else:
        assert printed == ["rank 1 WARNING Ran out of data; last step was canceled."]
        assert not (tmp_path / "torchtitan.log").exists()
