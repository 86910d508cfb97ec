"""Train through torchtitan: ``[torchrun --nproc_per_node=N] python -m linrnn.train --config NAME [overrides]``.

Checks the config name, applies linrnn's back-fills (``linrnn.training.compat``) before torchtitan is imported
and runs its trainer (``linrnn.training.launch``: ``--module`` is ``linrnn.training.configs``). Without torchrun it
runs as a single process.
``--list-configs`` prints the config names (``{cell}_{size}_{parametrization}``), ``--help`` the usage.
The console carries linrnn's progress lines from rank 0 and every rank's warnings and errors; torchtitan's own
log goes to ``{dump_folder}/torchtitan.log`` (``linrnn.training.logs``).
"""

from __future__ import annotations

import difflib
import logging
import os
import sys

from linrnn.training.launch import flag_value, run_trainer

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
    if ("-h" in argv or "--help" in argv) and flag_value(argv, "--config") is None:
        print(USAGE)
        return 0
    from linrnn.training import compat

    compat.install()
    from linrnn.training import configs

    if "--list-configs" in argv:
        print("\n".join(configs.config_names()))
        return 0
    name = flag_value(argv, "--config")
    if name is None:
        raise SystemExit("linrnn.train: --config NAME is required (python -m linrnn.train --list-configs lists them)")
    if name not in configs.config_names():
        close = difflib.get_close_matches(name, configs.config_names(), n=5)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise SystemExit(
            f"linrnn.train: unknown config {name!r}{hint} Known configs are {{cell}}_{{size}}_{{param}} with "
            f"cell in {list(configs.cells())}, size in {list(configs.SIZES)}, param in "
            f"{list(configs.PARAMETRIZATIONS)} (--list-configs prints all {len(configs.config_names())})"
        )
    run_trainer(argv)
    return 0


if __name__ == "__main__":
    code = main()
    # Training has finished and torchtitan has destroyed the process group. Interpreter teardown can still abort
    # ("terminate called without an active exception", from gloo's threads; seen once in a CPU CI run of torchrun),
    # which torchrun reports as a failed run; so flush and leave without it.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
