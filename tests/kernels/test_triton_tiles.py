"""The kernels' tile loads and stores (linrnn/kernels/triton/tiles.py): in-bounds elements move, nothing else does.

Compiled on CUDA; on a CPU-only machine under ``TRITON_INTERPRET=1`` (set before triton is imported).
"""

import importlib.util
import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from linrnn.kernels.triton.tiles import load_head_tile, store_head_tile  # noqa: E402

SENTINEL = -7.0


@triton.jit
def copy_tile_kernel(x, y, bos, length, h, row0, col0, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                     BD: tl.constexpr):  # fmt: skip
    """Copies one tile of head h of a sequence from x to y (both ``[TT, H, D]``), loaded values plus one."""
    tile = load_head_tile(x, bos, length, h, row0, col0, H, D, BR, BD)
    store_head_tile(y, tile + 1, bos, length, h, row0, col0, H, D, BR, BD)


@pytest.mark.parametrize(
    "bos, length, row0, col0",
    [(0, 10, 0, 0), (3, 10, 8, 0), (3, 5, 0, 8), (2, 7, 4, 12)],
    ids=["inside", "past_sequence_end", "past_last_column", "both_edges"],
)
def test_copy_tile_touches_only_its_bounds(bos, length, row0, col0):
    TT, H, D, BR, BD, h = 16, 3, 20, 8, 16, 1
    x = torch.randn(TT, H, D, device=DEVICE)
    y = torch.full_like(x, SENTINEL)
    copy_tile_kernel[(1,)](x, y, bos, length, h, row0, col0, H, D, BR, BD)
    expected = torch.full_like(x, SENTINEL)
    rows = slice(bos + row0, bos + min(length, row0 + BR))
    cols = slice(col0, min(D, col0 + BD))
    expected[rows, h, cols] = x[rows, h, cols] + 1
    assert torch.equal(y, expected)


@triton.jit
def load_sum_kernel(x, out, bos, length, h, row0, col0, H: tl.constexpr, D: tl.constexpr, BR: tl.constexpr,
                    BD: tl.constexpr):  # fmt: skip
    tl.store(out, tl.sum(load_head_tile(x, bos, length, h, row0, col0, H, D, BR, BD)))


def test_load_is_zero_out_of_bounds():
    """Rows past the sequence and columns past D read as 0, though x holds data there (the next sequence)."""
    x = torch.ones(16, 2, 12, device=DEVICE)
    out = torch.zeros(1, device=DEVICE)
    load_sum_kernel[(1,)](x, out, 0, 5, 1, 2, 8, 2, 12, 8, 8)  # rows 2..4 valid (3), columns 8..11 valid (4)
    assert out.item() == 12


def test_host_launch_sizes_match_triton():
    """``cdiv`` and ``next_power_of_2`` (host launch sizes, cheaper to call) give Triton's results."""
    from linrnn.kernels.triton import cdiv, next_power_of_2

    assert [next_power_of_2(n) for n in range(2100)] == [triton.next_power_of_2(n) for n in range(2100)]
    pairs = [(x, y) for x in range(300) for y in range(1, 70)]
    assert [cdiv(x, y) for x, y in pairs] == [triton.cdiv(x, y) for x, y in pairs]
