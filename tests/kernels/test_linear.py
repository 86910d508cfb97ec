"""The decoding matrix-vector kernel (``linrnn.kernels.linear``, ``triton/gemv.py``) against fp64 products: odd
sizes, 1 to 8 rows, with and without bias, x read in place from a column slice, NaN-poisoned outputs; when
``linear`` takes it and when ``F.linear``; ``Linear`` as ``nn.Linear``; the fused inputs (add + RMSNorm, gated
RMSNorm, SwiGLU) in the kernel's prologue and on their own. The kernel runs compiled on CUDA and under
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

from linrnn.kernels.linear import GEMV_MAX_ROWS, GatedRMSNormed, Linear, RMSNormed, SwiGLUed, linear  # noqa: E402
from tests.helpers import nan_filled  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture
def gemv_calls(monkeypatch):
    """Every matrix-vector launch's (rows, columns), with NaN-filled output buffers."""
    from linrnn.kernels.triton import gemv

    calls = []
    launch = gemv._launch

    def recorded(x, weight, *args, **kwargs):
        calls.append((x.shape[0], weight.shape[0]))
        return launch(x, weight, *args, **kwargs)

    monkeypatch.setattr(gemv, "new_output", nan_filled)
    monkeypatch.setattr(gemv, "_launch", recorded)
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


def _rounded(dtype, *tensors):
    return [None if t is None else t.to(dtype).double() for t in tensors]


def _rms_expected(x, delta, norm_weight, eps, dtype):
    """fp64 RMSNorm of x + delta as the kernel stores the sum (rounded to x's dtype), and that sum."""
    total = x if delta is None else (x + delta).to(dtype).double()
    return total * torch.rsqrt(total.square().mean(-1, keepdim=True) + eps) * norm_weight, total


def _gated_expected(x, z, norm_weight, eps, gate):
    act = z.sigmoid() if gate == "sigmoid" else F.silu(z)
    return (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps) * norm_weight * act).flatten(-2)


@pytest.mark.parametrize("dtype, rows", [(torch.bfloat16, 1), (torch.float16, 3), (torch.bfloat16, 8)])
@pytest.mark.parametrize("kind, shape", [
    ("rms", (37, 100)),  # narrow: K whole
    ("rms_delta", (37, 100)),
    ("rms_delta", (9, 1000)),  # K blocks of 512 / rows (at least 64): the last one partly filled
    ("gated_silu", (21, (3, 16))),  # 3 heads of 16 in a K block of 64
    ("gated_sigmoid", (13, (5, 32))),  # K blocks of 32 (below): one head per K block
    ("swiglu", (37, 100)),
])  # fmt: skip
def test_fused_inputs_match_fp64(gemv_calls, monkeypatch, dtype, rows, kind, shape):
    """Each fused input through the kernel's prologue against the fp64 step and product (no rounding between them),
    the residual sum ``total`` included; the outputs NaN-poisoned."""
    from linrnn.kernels.triton import gemv

    columns, depth = shape
    if kind == "gated_sigmoid":
        monkeypatch.setattr(gemv, "MAX_BLOCK_K", 32)
    torch.manual_seed(rows * columns)
    heads, head_dim = depth if kind.startswith("gated") else (1, depth)
    width = heads * head_dim
    weight = torch.randn(columns, width, dtype=torch.float64) / width**0.5
    bias = torch.randn(columns, dtype=torch.float64)
    weight, bias = _rounded(dtype, weight, bias)
    eps = 1e-6
    if kind.startswith("rms"):
        x, delta = torch.randn(rows, 1, width), torch.randn(rows, 1, width) if kind == "rms_delta" else None
        norm_weight = 1 + 0.1 * torch.randn(width)
        x, delta, norm_weight = _rounded(dtype, x, delta, norm_weight)
        normed, total = _rms_expected(x, delta, norm_weight, eps, dtype)
        fused = RMSNormed(*(None if t is None else t.to(dtype).to(DEVICE) for t in (x, norm_weight)), eps,
                          None if delta is None else delta.to(dtype).to(DEVICE), backend="triton")  # fmt: skip
    elif kind.startswith("gated"):
        gate = kind.split("_")[1]
        wide = torch.randn(rows, 1, 3 * width)  # o and z as column slices of one projection, as the mixer's g is
        x, z = (wide[..., i * width : (i + 1) * width].unflatten(-1, (heads, head_dim)) for i in (0, 2))
        norm_weight = 1 + 0.1 * torch.randn(head_dim)
        x, z, norm_weight = _rounded(dtype, x, z, norm_weight)
        normed, total = _gated_expected(x, z, norm_weight, eps, gate), None
        on_device = wide.to(dtype).to(DEVICE)
        x_d, z_d = (on_device[..., i * width : (i + 1) * width].unflatten(-1, (heads, head_dim)) for i in (0, 2))
        fused = GatedRMSNormed(x_d.contiguous(), z_d, norm_weight.to(dtype).to(DEVICE), eps, gate, backend="triton")
    else:
        both = _rounded(dtype, torch.randn(rows, 1, 2 * width))[0]
        normed, total = F.silu(both[..., :width]) * both[..., width:], None
        fused = SwiGLUed(both.to(dtype).to(DEVICE), backend="triton")
    with torch.no_grad():
        y = linear(fused, weight.to(dtype).to(DEVICE), bias.to(dtype).to(DEVICE), backend="triton")
    assert gemv_calls == [(rows, columns)]
    assert y.shape == (rows, 1, columns) and y.dtype == dtype
    if kind == "rms_delta":  # the norm of the sum as stored (the interpreter rounds bf16 by truncation)
        normed, _ = _rms_expected(fused.total.double().cpu(), None, norm_weight, eps, dtype)
    expected = F.linear(normed, weight, bias)
    torch.testing.assert_close(y.double().cpu(), expected, rtol=2 * torch.finfo(dtype).eps, atol=2e-3)
    if kind == "rms":
        assert fused.total is fused.source
    if kind == "rms_delta":  # the sum as the unfused add + norm kernel stores it, and within its rounding of fp64's
        from linrnn.kernels.fused import rms_norm

        _, unfused = rms_norm(fused.source, fused.weight, eps, fused.delta, backend="triton")
        torch.testing.assert_close(fused.total, unfused, rtol=0, atol=0)
        torch.testing.assert_close(fused.total.double().cpu(), total, rtol=torch.finfo(dtype).eps, atol=0)


def test_fused_inputs_off_the_kernel_compute_first(gemv_calls):
    """Where the kernel's prologue does not apply (too many rows, fp64, a head width not a power of two, autograd),
    the fused input is computed by its own kernel, then multiplied (by the plain matrix-vector kernel for a few 16-bit
    rows without autograd, else F.linear) — the same values."""
    torch.manual_seed(0)
    eps = 1e-6
    weight = torch.randn(6, 24, dtype=torch.float64)
    x, delta, z = torch.randn(3, GEMV_MAX_ROWS + 1, 24, dtype=torch.float64).unbind(0)
    norm_weight = torch.rand(24, dtype=torch.float64)
    normed, total = _rms_expected(x, delta, norm_weight, eps, torch.float64)
    fused = RMSNormed(x, norm_weight, eps, delta, backend="torch")
    torch.testing.assert_close(linear(fused, weight), F.linear(normed, weight))
    torch.testing.assert_close(fused.total, total, rtol=0, atol=0)
    heads = x[:2, None].unflatten(-1, (2, 12)).to(DEVICE, torch.bfloat16)  # 2 rows, heads of 12: not a power of two
    gates = z[:2, None].unflatten(-1, (2, 12)).to(DEVICE, torch.bfloat16)
    with torch.no_grad():
        y = linear(GatedRMSNormed(heads, gates, norm_weight[:12].to(DEVICE, torch.bfloat16), eps, backend="triton"),
                   weight.to(DEVICE, torch.bfloat16), backend="triton")  # fmt: skip
    expected = F.linear(_gated_expected(*_rounded(torch.bfloat16, heads.cpu(), gates.cpu(), norm_weight[:12]), eps,
                                        "silu"),
                        weight.to(torch.bfloat16).double())  # fmt: skip
    torch.testing.assert_close(y.double().cpu(), expected, rtol=0.02, atol=0.02)  # the norm rounded to bf16 first
    both = torch.randn(2, 24, dtype=torch.bfloat16, device=DEVICE, requires_grad=True)
    y = linear(SwiGLUed(both, backend="triton"), weight[:, :12].to(DEVICE, torch.bfloat16), backend="triton")
    assert y.grad_fn is not None and gemv_calls == [(2, 6)]  # the gated norm's product: the plain kernel


def test_fused_input_errors():
    with pytest.raises(ValueError, match="'delta' must have x's shape \\[2, 4\\], got \\[2, 3\\]"):
        RMSNormed(torch.zeros(2, 4), torch.ones(4), 1e-6, torch.zeros(2, 3))
    with pytest.raises(ValueError, match="'both' must have an even last dim, got \\[2, 5\\]"):
        SwiGLUed(torch.zeros(2, 5))


@pytest.mark.parametrize("rows, fused", [(1, False), (3, True), (8, False)])
def test_gate_columns_equal_the_gates_kernel_on_the_product(gemv_calls, rows, fused):
    """``MambaGateColumns``: g and β from the kernel's epilogue equal ``fused.mamba_gates`` on the product it
    stored, bit for bit (the same rounding and math), at odd column offsets, through the plain and the RMS-normed
    launch; the product is unchanged by the epilogue."""
    from linrnn.kernels.fused import MambaGateColumns, mamba_gates

    torch.manual_seed(rows)
    heads, columns, depth = 3, 41, 70
    weight = (3 * torch.randn(columns, depth) / depth**0.5).to(DEVICE, torch.bfloat16)
    x = torch.randn(rows, 1, depth).to(DEVICE, torch.bfloat16)
    a_log, dt_bias = torch.rand(heads).log().to(DEVICE), torch.randn(heads).to(DEVICE)

    def gates():
        return MambaGateColumns(decay_start=29, a_log=a_log, dt_bias=dt_bias, beta_start=7, beta_columns=heads,
                                beta_scale=2.0)  # fmt: skip

    def product(columns):
        source = RMSNormed(x, torch.ones(depth, device=DEVICE), 1e-6, backend="triton") if fused else x
        with torch.no_grad():
            return linear(source, weight, backend="triton", gates=columns)

    with_gates = gates()
    y = product(with_gates)
    assert gemv_calls == [(rows, columns)]
    torch.testing.assert_close(y, product(None), rtol=0, atol=0)
    with torch.no_grad():
        g, beta = mamba_gates(y[..., 29:32], a_log, dt_bias, y[..., 7:10], 2.0, backend="triton")
    assert with_gates.g.shape == with_gates.beta.shape == (rows, 1, heads)
    torch.testing.assert_close(with_gates.g, g, rtol=0, atol=0)
    torch.testing.assert_close(with_gates.beta, beta, rtol=0, atol=0)
    off_the_kernel = gates()
    with torch.no_grad():
        linear(x.float(), weight.float(), backend="triton", gates=off_the_kernel)  # fp32: F.linear
    assert off_the_kernel.g is None and off_the_kernel.beta is None
