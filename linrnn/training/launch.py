"""torchtitan's trainer on linrnn's configs, as ``python -m linrnn.train`` and ``linrnn train`` run it.

``run_trainer(argv)`` points ``--module`` at ``linrnn.training.configs`` (unless given), sets the environment of a
single process where torchrun has not, puts linrnn's console and run file in place of torchtitan's log handler
(``linrnn.training.logs``) and runs ``torchtitan.train.main`` on ``argv``. ``parse_flags(argv)`` parses the same
flags with torchtitan's parser without training or writing anything (``linrnn train`` checks its flags so before
it writes a run's manifest). ``linrnn.training.compat.install()`` must have run before either (it patches
torchtitan before its import).

``finished_step`` is the last training step this process finished (``linrnn train``'s line after Ctrl-C). A
run's folder keeps no empty ``comm_traces/``: torchtitan makes it for the NCCL flight recorder's dumps, which are
written only when a collective times out.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import sys
from pathlib import Path

from linrnn.errors import UsageError

MODULE = "linrnn.training.configs"
TRACES = "comm_traces"  # torchtitan's --comm.save_traces_folder default
finished_step = 0


def run_trainer(argv: list[str]) -> None:
    """Trains the config that ``argv`` names (``--config NAME`` and torchtitan's flags)."""
    if flag_value(argv, "--module") is None:
        argv = ["--module", MODULE, *argv]
    for key, value in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1")):
        os.environ.setdefault(key, value)  # a single process without torchrun
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    import torchtitan.train

    from linrnn.training import logs

    torchtitan.train.init_logger = logs.install  # linrnn's console and run file in place of torchtitan's handler
    _track_steps()
    sys.argv = [sys.argv[0], *argv]
    try:
        torchtitan.train.main()
    except KeyboardInterrupt:  # torchtitan closes its trainer on an Exception only
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        raise
    finally:
        folder = logs.run_folder()
        logs.close()
        if folder is not None:
            with contextlib.suppress(OSError):  # not empty (a timeout's dumps), or gone: leave it
                Path(folder, TRACES).rmdir()


def parse_flags(argv: list[str]):
    """torchtitan's config for ``argv`` (as ``run_trainer`` gets them), parsed by torchtitan's own parser without
    training or writing anything; a flag it refuses is a ``UsageError`` with its message on one line (in place of
    its box on stderr)."""
    from torchtitan.config import ConfigManager

    if flag_value(argv, "--module") is None:
        argv = ["--module", MODULE, *argv]
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
            return ConfigManager().parse_args(argv)
    except SystemExit as exit:  # tyro's box, exit status 2; or its help (-- --help), exit status 0
        if not exit.code:
            sys.stdout.write(printed.getvalue())
            raise
        raise UsageError(f"torchtitan flags: {_box_message(printed.getvalue())}") from exit
    except (ValueError, TypeError, AssertionError) as error:  # a value the config's own checks refuse
        raise UsageError(f"torchtitan flags: {' '.join(str(error).split()) or type(error).__name__}") from error


def _box_message(text: str) -> str:
    """The message of tyro's error box in one line: what is wrong, and its suggestion ("Perhaps you meant")."""
    lines = []
    for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines():
        line = line.strip().strip("│┃|╭╮╰╯─━").strip()
        if line and set(line) - set("-─━ ") and not line.startswith("For full helptext"):
            lines.append(line)
    titles = ("Unrecognized options", "Value error", "Missing argument", "Parsing error", "Required options")
    start = next((i for i, line in enumerate(lines) if line in titles), None)
    if start is None:
        return "; ".join(lines[-3:]) or "refused (no message)"
    message = lines[start + 1] if start + 1 < len(lines) else lines[start]
    for i, line in enumerate(lines[start:], start):
        if line.startswith("Perhaps you meant") and i + 1 < len(lines):
            message += f" (perhaps you meant {lines[i + 1].split()[0]})"
            break
    return message


def _track_steps() -> None:
    """Wraps torchtitan's ``Trainer.train_step`` so that ``finished_step`` follows the run."""
    from torchtitan.trainer import Trainer

    if getattr(Trainer.train_step, "tracked", False):
        return
    train_step = Trainer.train_step

    @functools.wraps(train_step)
    def tracked(self, *args, **kwargs):
        global finished_step
        result = train_step(self, *args, **kwargs)
        finished_step = self.step
        return result

    tracked.tracked = True
    Trainer.train_step = tracked


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value of ``flag`` in ``argv`` (``--flag VALUE`` or ``--flag=VALUE``, the first one), else None."""
    for i, arg in enumerate(argv):
        if arg == flag and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
    return None


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
