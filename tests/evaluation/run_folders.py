"""Run folders as ``linrnn train`` leaves them (manifest, model.pt, tokenizer/), with a small byte-level BPE
tokenizer trained on the demo sonnet and a random model, for the evaluation tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import linrnn
from linrnn.models import LanguageModel, save_checkpoint
from linrnn.text import TEXT
from linrnn.training import runs
from linrnn.training.data import _train_tokenizer


def train_tokenizer(folder: Path, vocab_size: int = 300) -> Path:
    """``folder`` with tokenizer.json (byte-level BPE with <s> and </s>) and tokenizer_config.json, as
    ``linrnn data prepare`` writes them."""
    _train_tokenizer([TEXT], vocab_size, folder)
    return folder


def small_model(vocab_size: int, cell: str = "gdn") -> LanguageModel:
    return linrnn.build_model(cell, preset="byte-tiny", vocab_size=vocab_size, num_layers=1).eval()


def make_run_folder(folder: Path, model: LanguageModel, tokenizer: Path, config: str = "gdn_tiny_sp") -> Path:
    """``folder`` holding ``model`` as a finished ``linrnn train`` run of ``config`` with ``tokenizer``."""
    folder.mkdir(parents=True)
    save_checkpoint(model, folder / "model.pt")
    shutil.copytree(tokenizer, folder / "tokenizer")
    identity = runs.Identity(config, (), "test documents", runs.file_sha256(tokenizer / "tokenizer.json"))
    runs.write_manifest(folder, identity, steps=1, result={"bpb": 1.0, "token_unigram_bpb": 2.0})
    return folder
