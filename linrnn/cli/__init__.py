"""The ``linrnn`` command: ``linrnn demo``, ``linrnn cells``, ``linrnn presets``, ``linrnn stability``,
``linrnn coord-check``, ``linrnn train``, ``linrnn sweep``, ``linrnn data prepare``, ``linrnn generate``,
``linrnn export``, ``linrnn eval mqar``, ``linrnn eval length``.

One module per command group parses its arguments and calls the library: ``demo``, ``listings`` (cells,
presets), ``stability``, ``coord_check``, ``sweep``, ``train``, ``generate``, ``export``, ``data``, ``evaluation``
(eval); ``arguments`` has the parser pieces and the argparse value types they share.

Every error in a user's arguments or input is one line on stderr, ``linrnn <command>: <message>``, with exit
status 2: argparse's (``arguments.Parser``) and ``linrnn.errors.UsageError`` raised by a command. ``--debug`` shows
the traceback of a ``UsageError`` instead; other exceptions always show theirs. Ctrl-C is one line too, exit status
130. Commands check their arguments before they compute anything; the argparse types do it per value.
"""

from __future__ import annotations

import argparse
import sys

from linrnn.cli import coord_check, data, demo, evaluation, export, generate, listings, stability, sweep, train
from linrnn.cli.arguments import DEBUG_HELP, Parser, add_command
from linrnn.errors import UsageError, one_line


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit:  # --help (0), or a bad argument already reported on one line (2)
        return exit.code or 0
    try:
        return args.command(args)
    except UsageError as error:
        if args.debug:
            raise
        print(f"{args.prog}: {one_line(error)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C: one line, not a traceback (linrnn train says where to resume)
        if args.debug:
            raise
        print(f"{args.prog}: interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="linrnn", description="Linear-RNN token mixers on one recurrence.")
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    for name, summary, module in (
        ("demo", "train each cell's byte-tiny model briefly on a sonnet, then sample", demo),
        ("stability", "spectral radius, norms and growth of each cell's transition against its certificate",
         stability),
        ("coord-check", "coordinate sizes against width over a few training steps (the muP check)", coord_check),
        ("sweep", "learning-rate transfer: short runs over widths × lrs × parametrizations × optimizers", sweep),
        ("train", "prepare the embedded corpus, train through torchtitan, report validation bpb and a sample",
         train),
        ("generate", "stream text from a saved model (linrnn train's model.pt, or linrnn demo --save)", generate),
        ("export", "a linrnn train run folder as a Hugging Face folder (AutoModelForCausalLM.from_pretrained)",
         export),
    ):  # fmt: skip
        module.add_arguments(add_command(commands, name, summary, module.run))
    data.add_commands(commands.add_parser("data", help="training data"))
    eval_parser = commands.add_parser("eval", help="is a cell any good: associative recall, loss by position")
    evaluation.add_commands(eval_parser)
    add_command(commands, "cells", "list the recurrence cells and the attention mixer", listings.cells)
    listings.add_presets_arguments(
        add_command(commands, "presets", "list the model presets with parameter counts", listings.presets)
    )
    return parser
