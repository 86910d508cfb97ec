import os

import pytest
import torch

if not torch.cuda.is_available():
    # Triton reads this when it is imported, and torch may import it first (torch._dynamo does, on first use): set it
    # before any test runs, so that the kernel tests run the interpreter whichever module imports Triton first
    os.environ.setdefault("TRITON_INTERPRET", "1")

# The suite's tensors are small: one intra-op thread is ~2x faster than two on CI's 2 cores (67 s vs 118 s).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
