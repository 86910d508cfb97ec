"""What the commands' parsers share: ``Parser`` (one-line errors), ``add_command`` (a subcommand with ``--debug``)
and the argparse value types.

Each type checks one value; argparse reports "argument --x: <message>", or "invalid <type> value: 'x'" when
int() or float() fails.
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import linrnn

DEBUG_HELP = "show the traceback of an error in the arguments or input instead of one line"


class Parser(argparse.ArgumentParser):
    """argparse whose errors are one line, ``linrnn <command>: argument --x: ...`` (no usage block), exit 2."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: {message}\n")


def add_command(commands, name: str, summary: str, command: Callable | None = None) -> argparse.ArgumentParser:
    """A subcommand with its own ``--debug`` (so that it may follow the command too) and its ``prog`` for errors."""
    parser = commands.add_parser(name, help=summary)
    parser.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP)
    parser.set_defaults(command=command, prog=parser.prog)
    return parser


# numbers


def positive_int(text: str) -> int:
    return _number(text, int, lambda value: value >= 1, "a positive integer")


def nonnegative_int(text: str) -> int:
    return _number(text, int, lambda value: value >= 0, "an integer >= 0")


def positive_float(text: str) -> float:
    return _number(text, float, lambda value: value > 0, "a number > 0")


def float_in(low: float, high: float = math.inf) -> Callable[[str], float]:
    """The argparse type of a number in [low, high]."""
    expected = f"a number >= {low:g}" if high == math.inf else f"a number in [{low:g}, {high:g}]"
    return lambda text: _number(text, float, lambda value: low <= value <= high, expected)


def _number(text: str, kind: type, ok: Callable[[float], bool], expected: str):
    """``kind(text)`` if it parses and is ``ok``, else the error "expected <expected>, got <text>"."""
    try:
        value = kind(text)
    except ValueError:
        value = None
    if value is None or not ok(value):  # NaN is never ok
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text}")
    return value


def learning_rates(text: str) -> list[float]:
    """A learning rate, or ``LOW:HIGH:COUNT``: COUNT log-spaced ones (``linrnn sweep``)."""
    from linrnn.training.sweep import log_grid

    try:
        if ":" in text:
            low, high, count = text.split(":")
            return log_grid(float(low), float(high), int(count))
        return [float(text)]
    except ValueError as error:
        message = f"expected a learning rate or LOW:HIGH:COUNT, got {text!r} ({error})"
        raise argparse.ArgumentTypeError(message) from None


def comma_list(item: Callable[[str], Any], what: str) -> Callable[[str], list]:
    """The argparse type of a comma-separated list of distinct ``item``s (at least one)."""

    def parse(text: str) -> list:
        parts = text.split(",")
        if not text.strip() or any(not part.strip() for part in parts):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {what}, got {text!r}")
        values = [item(part.strip()) for part in parts]
        if len(set(values)) != len(values):
            raise argparse.ArgumentTypeError(f"expected distinct {what}, got {text!r} ({values})")
        return values

    return parse


# names


def cell_name(name: str) -> str:
    try:
        return linrnn.get_cell(name).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def parametrization_name(name: str) -> str:
    """The canonical name of a registered parametrization (aliases such as ``gdnmup`` resolve)."""
    from linrnn import parametrizations

    try:
        return parametrizations.get(name).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def stability_cell(name: str) -> str:
    """A cell of ``linrnn stability``: a registered cell (canonical name), kda_f or all."""
    from linrnn.stability.transition import stability_cell as canonical

    if name == "all":
        return name
    try:
        return canonical(name)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def model_name(text: str) -> str:
    """A model of ``linrnn eval mqar``: a canonical cell name (aliases resolve), or one of FLA's models."""
    from linrnn.evaluation.mqar_task import FLA_MODELS
    from linrnn.recurrences.registry import canonical_name

    if text in FLA_MODELS:
        return text
    try:
        return canonical_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(f"{error}; or FLA's models {', '.join(FLA_MODELS)}") from error


def devices(text: str) -> list[str]:
    """``cpu`` or CUDA devices that exist here, comma-separated; ``cuda`` means ``cuda:0``."""
    names = []
    for name in comma_list(str, "devices")(text):
        try:
            device = torch.device(name)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise argparse.ArgumentTypeError(f"expected cpu or cuda[:N], got {name!r}")
        if device.type == "cuda" and (index := device.index or 0) >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(
                f"expected a CUDA device that exists here ({torch.cuda.device_count()} visible), got {name!r} "
                f"(index {index})"
            )
        names.append("cpu" if device.type == "cpu" else f"cuda:{index}")
    if len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"expected distinct devices, got {text!r}")
    return names


# files


def existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"expected an existing file, got {text!r}")
    return path


def plot_file(text: str) -> Path:
    """A file name whose suffix matplotlib writes (png, pdf, svg, ...), in an existing folder: checked before
    the computation that the plot comes after."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # the plots' backend

    path = Path(text)
    formats = sorted(FigureCanvasAgg.get_supported_filetypes())
    if path.suffix.lower().removeprefix(".") not in formats:
        raise argparse.ArgumentTypeError(f"expected a file name ending in .{', .'.join(formats)}, got {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r}")
    if problem := unwritable(path.parent):
        raise argparse.ArgumentTypeError(f"expected a file in a writable folder, got {text!r} ({problem})")
    if path.exists() and not (path.is_file() and os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"expected a writable file, got {text!r}")
    return path


def unwritable(folder: str | Path) -> str | None:
    """Why no file can be written into ``folder``, or None if one can. A folder that does not exist yet is made
    later inside its nearest existing parent, so that parent is tried. Tried for real (a temporary file, removed at
    once), because permission bits do not tell: root ignores them, and a read-only file system refuses root too."""
    probe = Path(folder).expanduser().absolute()
    while not probe.exists() and probe.parent != probe:
        probe = probe.parent
    if not probe.is_dir():
        return f"{probe} is not a folder"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as error:
        return f"cannot create a file in {probe}: {error.strerror or error}"
    return None


def json_file(text: str) -> Path:
    """A ``.json`` file name in an existing folder."""
    path = Path(text)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(f"expected a file name ending in .json, got {text!r}")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r}")
    return path


def results_file(text: str) -> Path:
    """A ``.json`` file name in an existing, writable folder; an existing file must be readable and writable."""
    path = Path(text)
    if path.suffix != ".json":
        raise argparse.ArgumentTypeError(f"expected a file name ending in .json (the plot goes beside it), "
                                         f"got {text!r}")  # fmt: skip
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"expected a file in an existing folder, got {text!r}")
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"expected a file in a writable folder, got {text!r}")
    if path.exists() and not (path.is_file() and os.access(path, os.R_OK | os.W_OK)):
        raise argparse.ArgumentTypeError(f"expected a readable and writable file, got {text!r}")
    return path
