import pytest
import torch

# The suite's tensors are small: one intra-op thread is ~2x faster than two on CI's 2 cores (67 s vs 118 s).
torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
