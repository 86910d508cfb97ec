"""torchtitan's trainer on linrnn's configs, as ``python -m linrnn.train`` and ``linrnn train`` run it.

``run_trainer(argv)`` points ``--module`` at ``linrnn.training.configs`` (unless given), sets the environment of a
single process where torchrun has not, puts linrnn's console and run file in place of torchtitan's log handler
(``linrnn.training.logs``) and runs ``torchtitan.train.main`` on ``argv``. ``linrnn.training.compat.install()``
must have run before (it patches torchtitan before its import).
"""

from __future__ import annotations

import os
import sys

MODULE = "linrnn.training.configs"


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
    sys.argv = [sys.argv[0], *argv]
    try:
        torchtitan.train.main()
    finally:
        logs.close()


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
