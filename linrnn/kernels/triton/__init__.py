"""Triton kernels of the generalized recurrence (imported lazily: ``import linrnn`` never imports Triton)."""

import torch
from torch import Tensor


def new_output(shape, dtype, device) -> Tensor:
    """Uninitialised output buffer. Each kernel module calls it by its own global name, so tests replace that
    name to poison the outputs with NaN."""
    return torch.empty(shape, dtype=dtype, device=device)


def cdiv(x: int, y: int) -> int:
    """``⌈x / y⌉`` for launch grids and tile sizes on the host: ``triton.cdiv`` is a constexpr function whose calls
    cost microseconds of host time each (about 15 in a chunk forward)."""
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    """The smallest power of two ≥ n (0 for 0, as ``triton.next_power_of_2``), on the host (see ``cdiv``)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0
