"""Train through torchtitan: ``[torchrun --nproc_per_node=N] python -m linrnn.train --config NAME [overrides]``.

Applies linrnn's back-fills (``linrnn.training.compat``) before torchtitan is imported, points torchtitan's
``--module`` at ``linrnn.training.configs`` and runs its trainer. Without torchrun it runs as a single process.
``--list-configs`` prints the config names (``{cell}_{size}_{parametrization}``), ``--help`` the usage.
The console carries linrnn's progress lines from rank 0 and every rank's warnings and errors; torchtitan's own
log goes to ``{dump_folder}/torchtitan.log`` (``linrnn.training.logs``).
"""

from __future__ import annotations

import difflib
import logging
import os
import sys

MODULE = "linrnn.training.configs"
USAGE = """\
usage: python -m linrnn.train --config NAME [torchtitan flags ...]
       torchrun --nproc_per_node=N -m linrnn.train --config NAME [torchtitan flags ...]
       python -m linrnn.train --list-configs

Trains one of linrnn's named configs through torchtitan, on GPUs or on the CPU (one process without torchrun).

options:
  --config NAME    the run, {cell}_{size}_{parametrization}, e.g. gdn_tiny_sp
  --list-configs   print the config names and exit
  -h, --help       print this help and exit (with --config NAME: torchtitan's flags)

Every other flag is torchtitan's and overrides a field of the config, e.g. --training.steps 50,
--training.local_batch_size 8, --optimizer.lr 1e-3, --dump_folder DIR, --validator.freq 100,
--checkpoint.no-enable. The console shows linrnn's progress lines (rank 0) and all warnings and errors;
torchtitan's full log is DIR/torchtitan.log, the metrics DIR/metrics.jsonl."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if ("-h" in argv or "--help" in argv) and _option(argv, "--config") is None:
        print(USAGE)
        return 0
    from linrnn.training import compat

    compat.install()
    from linrnn.training import configs

    if "--list-configs" in argv:
        print("\n".join(configs.config_names()))
        return 0
    name = _option(argv, "--config")
    if name is None:
        raise SystemExit("linrnn.train: --config NAME is required (python -m linrnn.train --list-configs lists them)")
    if name not in configs.config_names():
        close = difflib.get_close_matches(name, configs.config_names(), n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SystemExit(
            f"linrnn.train: unknown config {name!r}{hint} Known configs are {{cell}}_{{size}}_{{param}} with "
            f"cell in {list(configs.CELLS)}, size in {list(configs.SIZES)}, param in "
            f"{list(configs.PARAMETRIZATIONS)} (--list-configs prints all {len(configs.config_names())})"
        )
    if _option(argv, "--module") is None:
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
    return 0


def _option(argv: list[str], flag: str) -> str | None:
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


if __name__ == "__main__":
    code = main()
    # Training has finished and torchtitan has destroyed the process group. Interpreter teardown can still abort
    # ("terminate called without an active exception", from gloo's threads; seen once in a CPU CI run of torchrun),
    # which torchrun reports as a failed run; so flush and leave without it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
