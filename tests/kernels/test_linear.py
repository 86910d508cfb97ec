"""The decoding matrix-vector kernel (``linrnn.kernels.linear``, ``triton/gemv.py``) against fp64 products: odd
sizes, 1 to 8 rows, with and without bias, x read in place from a column slice, NaN-poisoned outputs; when
``linear`` takes it and when ``F.linear``; ``Linear`` as ``nn.Linear``. The kernel runs compiled on CUDA and under
``TRITON_INTERPRET=1`` on a CPU-only machine."""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F
from torch import nn

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first

from linrnn.kernels.linear import GEMV_MAX_ROWS, Linear, linear  # noqa: E402
from tests.helpers import nan_filled  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture
def gemv_calls(monkeypatch):
    """Every matrix-vector launch's (rows, columns), with NaN-filled output buffers."""
    from linrnn.kernels.triton import gemv

    calls = []
    launch = gemv.gemv

    def recorded(x, weight, bias=None):
        calls.append((x.shape[0], weight.shape[0]))
        return launch(x, weight, bias)

    monkeypatch.setattr(gemv, "new_output", nan_filled)
    monkeypatch.setattr(gemv, "gemv", recorded)
    return calls


@pytest.mark.parametrize("dtype, rows", [(torch.bfloat16, 1), (torch.float16, 3), (torch.bfloat16, 8)])
@pytest.mark.parametrize("columns, depth, with_bias", [(37, 100, False), (130, 64, True), (5, 1000, True)])
@pytest.mark.parametrize("blocks", [None, (16, 32), "wide"], ids=["default", "blocked", "wide"])
def test_matches_the_fp64_product(gemv_calls, monkeypatch, dtype, rows, columns, depth, with_bias, blocks):
    """``blocks``: (W rows a program, K per loop step) in place of the defaults (for these narrow outputs: 2 rows,
    the whole K), or "wide": the wide outputs' shape (4 rows, K by 512): partly filled blocks of rows and of K."""
    from linrnn.kernels.triton import gemv

    if blocks == "wide":
        monkeypatch.setattr(gemv, "WIDE_COLUMNS", 1)
    elif blocks is not None:
        monkeypatch.setattr(gemv, "BLOCK_N", blocks[0])
        monkeypatch.setattr(gemv, "MAX_BLOCK_K", blocks[1])
    torch.manual_seed(rows * columns + depth)
    wide = torch.randn(rows, 1, depth + 9, dtype=torch.float64)  # x: a column slice, rows depth + 9 apart
    x = wide[..., 4 : 4 + depth]
    weight = torch.randn(columns, depth, dtype=torch.float64) / depth**0.5
    bias = torch.randn(columns, dtype=torch.float64) if with_bias else None
    expected = F.linear(x.to(dtype).double(), weight.to(dtype).double(),
                        None if bias is None else bias.to(dtype).double())  # fmt: skip
    on_device = [None if t is None else t.to(dtype).to(DEVICE) for t in (wide, weight, bias)]
    with torch.no_grad():
        y = linear(on_device[0][..., 4 : 4 + depth], on_device[1], on_device[2], backend="triton")
    assert gemv_calls == [(rows, columns)]
    assert y.shape == (rows, 1, columns) and y.dtype == dtype
    # one rounding of an fp32 sum to the output dtype
    torch.testing.assert_close(y.double().cpu(), expected, rtol=torch.finfo(dtype).eps, atol=1e-3)


def test_linear_takes_the_kernel_only_for_a_decoding_step(gemv_calls):
    weight = torch.randn(12, 16, dtype=torch.bfloat16, device=DEVICE)
    x = torch.randn(2, 3, 16, dtype=torch.bfloat16, device=DEVICE)
    with torch.no_grad():
        linear(x, weight, backend="triton")  # 6 rows: the kernel
        linear(torch.randn(GEMV_MAX_ROWS + 1, 16, dtype=torch.bfloat16, device=DEVICE), weight, backend="triton")
        linear(x.float(), weight.float(), backend="triton")  # fp32: cuBLAS
        linear(x, weight, backend="torch")
        linear(x.transpose(0, 1), weight, backend="triton")  # rows at two strides
    y = linear(x.requires_grad_(), weight, backend="triton")  # autograd
    assert gemv_calls == [(6, 12)]
    assert y.grad_fn is not None


def test_linear_module_is_nn_linear():
    torch.manual_seed(0)
    plain, ours = nn.Linear(16, 12), Linear(16, 12, backend="triton")
    ours.load_state_dict(plain.state_dict())
    assert isinstance(ours, nn.Linear) and list(ours.state_dict()) == ["weight", "bias"]
    x = torch.randn(4, 16)
    torch.testing.assert_close(ours(x), plain(x), rtol=0, atol=0)
