"""``linrnn eval COMMAND``: the evaluation subcommands, each a module with ``add_arguments(parser)`` and
``run(args)``."""

from __future__ import annotations

import argparse


def add_commands(parser: argparse.ArgumentParser, add_command) -> None:
    """Adds ``mqar`` and ``length`` under ``parser`` (the ``eval`` command) with ``linrnn.cli.add_command``."""
    from linrnn.evaluation import length, mqar

    commands = parser.add_subparsers(title="eval commands", required=True, metavar="COMMAND")
    for name, summary, module in (
        ("mqar", "multi-query associative recall: accuracy against width per cell (a sweep, JSON and a plot)", mqar),
        ("length", "loss by token position of trained models on documents longer than their training length",
         length),
    ):  # fmt: skip
        module.add_arguments(add_command(commands, name, summary, module.run))
