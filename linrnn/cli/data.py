"""``linrnn data prepare``: download, split and tokenize the embedded corpus (``linrnn.training.data``)."""

from __future__ import annotations

import argparse
import json

from linrnn.cli.arguments import add_command


def add_commands(parser: argparse.ArgumentParser) -> None:
    """Adds ``prepare`` under ``parser`` (the ``data`` command)."""
    commands = parser.add_subparsers(title="data commands", required=True, metavar="COMMAND")
    prepare_parser = add_command(commands, "prepare", "download, split and tokenize the embedded corpus", prepare)
    prepare_parser.add_argument("--force", action="store_true", help="prepare again even if it is there")


def prepare(args: argparse.Namespace) -> int:
    from linrnn.training import data

    root = data.prepare(force=args.force)
    print(json.dumps(data.corpus_stats(), indent=1))
    print(f"prepared in {root}")
    return 0
