"""Fixtures of the training tests: the embedded corpus, prepared once per session (LINRNN_TEST_DATA: a folder
with a prepared corpus to use instead of downloading one)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """LINRNN_DATA pointing at a prepared corpus (4096-token tokenizer only), for this process and subprocesses."""
    from linrnn.training import data

    root = os.environ.get("LINRNN_TEST_DATA") or str(tmp_path_factory.mktemp("linrnn-data"))
    previous = os.environ.get("LINRNN_DATA")
    os.environ["LINRNN_DATA"] = root
    data.prepare(vocab_sizes=(4096,), log=lambda message: None)
    yield Path(root)
    if previous is None:
        os.environ.pop("LINRNN_DATA")
    else:
        os.environ["LINRNN_DATA"] = previous
