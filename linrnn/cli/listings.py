"""``linrnn cells`` (the recurrence cells and the other mixers) and ``linrnn presets`` (the model presets with
parameter counts)."""

from __future__ import annotations

import argparse
import math

import torch
from rich.console import Console
from rich.table import Table

import linrnn
from linrnn.cli.arguments import cell_name
from linrnn.models import LanguageModel, ModelConfig, list_presets, model_config


def cells(args: argparse.Namespace) -> int:
    """The recurrence cells, then the other mixers (softmax attention), each marked by its kind."""
    table = Table(title="linrnn cells")
    for column in ("name", "kind", "aliases", "decay", "erase", "recurrence"):
        table.add_column(column)
    for name in linrnn.list_mixers():
        spec = linrnn.get_cell(name)
        table.add_row(spec.name, spec.kind, ", ".join(spec.aliases) or "-", spec.decay or "-", spec.erase or "-",
                      spec.recurrence)  # fmt: skip
    Console().print(table)
    return 0


def add_presets_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cell",
        type=cell_name,
        default="gated_deltanet",
        help="cell whose parameters are counted (default gated_deltanet)",
    )


def presets(args: argparse.Namespace) -> int:
    table = Table(title=f"linrnn presets ({args.cell} parameters, tied embeddings)")
    for column in ("preset", "vocab", "hidden", "layers", "heads", "parameters"):
        table.add_column(column, justify="left" if column == "preset" else "right")
    for preset in list_presets():
        config = model_config(args.cell, preset)
        sizes = (config.vocab_size, config.hidden_size, config.num_layers, config.num_heads)
        table.add_row(preset, *(str(size) for size in sizes), human_count(count_parameters(config)))
    Console().print(table)
    return 0


def count_parameters(config: ModelConfig) -> int:
    with torch.device("meta"):  # shapes only: no memory, no initialisation cost
        return LanguageModel(config).num_parameters()


def human_count(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            value = n / size
            return f"{value:.{max(0, 2 - int(math.log10(value)))}f}{unit}"  # 3 significant digits
    return str(n)
