"""The short convolution + SiLU (Triton and torch paths) against an fp64 loop over taps: outputs and the gradients
of x, the weight and the history; packed documents; strided inputs; the custom op's registration.

The Triton kernels run compiled on CUDA and under ``TRITON_INTERPRET=1`` on a CPU-only machine.
"""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first

from linrnn.kernels.short_conv import short_conv, short_conv_pieces, short_conv_step  # noqa: E402
from tests.helpers import nan_filled  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]


def conv_loop(x, weight, history, offset):
    """fp64: y[t] = SiLU(Σ_j w[j] · x[t − (W − 1 − j)]), x before the start from the history (or 0), and 0 before
    a packed document's start."""
    batch, steps, channels = x.shape
    width = weight.shape[-1]
    w = weight.reshape(channels, width).double()
    if history is None:
        history = x.new_zeros(batch, channels, width - 1)
    extended = torch.cat([history.double().transpose(1, 2), x.double()], dim=1)  # [B, W − 1 + T, C]
    pre = torch.zeros(batch, steps, channels, dtype=torch.float64)
    for t in range(steps):
        for j in range(width):
            lag = width - 1 - j
            if offset is not None and lag > offset[t]:
                continue
            pre[:, t] += w[:, j] * extended[:, width - 1 + t - lag]
    return F.silu(pre)


def leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype).to(DEVICE).requires_grad_()


def check_against_loop(backend, x, weight, history=None, offset=None, atol=2e-5):
    dy = torch.randn(x.shape, dtype=torch.float64)
    y = short_conv(x, weight, history, offset, backend=backend)
    assert y.shape == x.shape and y.dtype == x.dtype and not y.isnan().any()
    leaves = [t for t in (x, weight, history) if t is not None]
    grads = torch.autograd.grad(y, leaves, dy.to(y.dtype).to(DEVICE))
    cpu = [t.detach().cpu().double().requires_grad_() for t in leaves]
    cpu_history = cpu[2] if history is not None else None
    expected = conv_loop(cpu[0], cpu[1], cpu_history, None if offset is None else offset.cpu())
    expected_grads = torch.autograd.grad(expected, cpu, dy)
    torch.testing.assert_close(y.cpu().double(), expected, rtol=0, atol=atol)
    for name, got, want in zip(["dx", "dw", "d_history"], grads, expected_grads, strict=False):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=atol * max(scale, 1), msg=name)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    if not HAS_TRITON:
        return
    from linrnn.kernels.triton import short_conv as kernels

    monkeypatch.setattr(kernels, "new_output", nan_filled)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_history", [False, True], ids=["zeros", "history"])
@pytest.mark.parametrize("steps, channels, width", [(1, 5, 4), (37, 130, 4), (45, 33, 3), (9, 7, 2)])
def test_matches_the_loop(backend, steps, channels, width, with_history):
    torch.manual_seed(steps * channels + width)
    x, weight = leaf(2, steps, channels), leaf(channels, 1, width)
    history = leaf(2, channels, width - 1) if with_history else None
    check_against_loop(backend, x, weight, history)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_documents_restart(backend):
    torch.manual_seed(3)
    lengths = [1, 5, 2, 36, 3]  # documents shorter and longer than the kernel's taps and its time block
    offset = torch.cat([torch.arange(n) for n in lengths]).to(DEVICE)
    x, weight = leaf(1, sum(lengths), 70), leaf(70, 1, 4)
    check_against_loop(backend, x, weight, offset=offset)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_packed_documents_do_not_read_the_history(backend):
    """With ``offset`` every document starts from zeros, the first one too: a history passed beside it is not read."""
    torch.manual_seed(6)
    lengths = [2, 40]
    offset = torch.cat([torch.arange(n) for n in lengths]).to(DEVICE)
    x, weight, history = leaf(1, sum(lengths), 33), leaf(33, 1, 4), leaf(1, 33, 3)
    check_against_loop(backend, x, weight, history, offset=offset)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("layout", ["history", "packed"])
def test_backward_programs_walk_several_blocks(monkeypatch, layout):
    """A backward program walks BWD_SPAN rows of BWD_CHANNELS channels, one row at a time: spans of 48 rows over 150
    (four programs a channel block, the last one short; documents crossing the spans' edges), 16 of 40 channels."""
    from linrnn.kernels.triton import short_conv as kernels

    monkeypatch.setattr(kernels, "BWD_SPAN", 48)
    monkeypatch.setattr(kernels, "BWD_CHANNELS", 16)
    torch.manual_seed(7)
    steps = 150
    x, weight = leaf(1 if layout == "packed" else 2, steps, 40), leaf(40, 1, 4)
    if layout == "packed":
        lengths = [30, 3, 40, 70, 7]
        offset = torch.cat([torch.arange(n) for n in lengths]).to(DEVICE)
        check_against_loop("triton", x, weight, offset=offset)
    else:
        check_against_loop("triton", x, weight, leaf(2, 40, 3))


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("widths", [[7, 20, 3, 10], [25, 15], [40], [8, 8, 8, 8, 8]], ids=["4", "2", "1", "5"])
@pytest.mark.parametrize("layout", ["history", "packed"])
def test_pieces_match_the_loop(backend, widths, layout, monkeypatch):
    """``short_conv_pieces`` (the mixers' streams): the output split into channel pieces — on the Triton path up to
    four separate contiguous tensors, whose gradients the backward reads in place (more: one output, split) — over
    a row stride wider than the channels, with the history or packed documents, against the fp64 loop; a piece whose
    output goes unused has no gradient (0). Backward spans of 48 rows over 150, 16 of 40 channels a program (the
    pieces cross the programs' channel blocks)."""
    if backend == "triton":
        from linrnn.kernels.triton import short_conv as kernels

        monkeypatch.setattr(kernels, "BWD_SPAN", 48)
        monkeypatch.setattr(kernels, "BWD_CHANNELS", 16)
    torch.manual_seed(len(widths))
    steps = 150
    wide, weight = leaf(1, steps, 45), leaf(40, 1, 4)
    x = wide[..., 2:42]
    history, offset = leaf(1, 40, 3), None
    if layout == "packed":
        history, offset = None, torch.cat([torch.arange(n) for n in [30, 3, 40, 70, 7]]).to(DEVICE)
    pieces = short_conv_pieces(x, weight, widths, history, offset, backend)
    assert [piece.shape[-1] for piece in pieces] == widths
    if backend == "triton" and len(widths) <= 4:
        assert all(piece.is_contiguous() for piece in pieces)
    used = pieces[:-1] if len(pieces) > 1 else pieces  # the last piece unused (when there are several)
    dys = [torch.randn(piece.shape, dtype=torch.float64) for piece in used]
    leaves = [t for t in (wide, weight, history) if t is not None]
    grads = torch.autograd.grad(used, leaves, [dy.to(DEVICE) for dy in dys])
    cpu = [t.detach().cpu().double().requires_grad_() for t in leaves]
    expected = conv_loop(cpu[0][..., 2:42], cpu[1], cpu[2] if history is not None else None,
                         None if offset is None else offset.cpu())  # fmt: skip
    torch.testing.assert_close(torch.cat([piece.detach() for piece in pieces], -1).cpu().double(), expected, rtol=0,
                               atol=2e-5)  # fmt: skip
    expected_used = expected.split(widths, dim=-1)[: len(used)]
    expected_grads = torch.autograd.grad(expected_used, cpu, dys)
    for name, got, want in zip(["dx", "dw", "d_history"], grads, expected_grads, strict=False):
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=2e-5 * max(want.abs().max().item(), 1),
                                   msg=name)  # fmt: skip


def test_pieces_must_cover_the_channels():
    x, weight = leaf(1, 5, 6), leaf(6, 1, 4)
    with pytest.raises(ValueError, match="argument 'widths' must add up to x's 6 channels, got \\[2, 3\\]"):
        short_conv_pieces(x, weight, [2, 3])


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_column_slice_of_a_wider_matrix(backend):
    """The mixers convolve slices of one projection GEMM's output: a row stride wider than the channels."""
    torch.manual_seed(4)
    wide, weight = leaf(2, 21, 50), leaf(20, 1, 4)
    x = wide[..., 13:33]
    assert not x.is_contiguous()
    check_against_loop(backend, x, weight)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_bf16_inputs_accumulate_in_fp32(backend):
    torch.manual_seed(5)
    x, weight = leaf(2, 40, 24, dtype=torch.bfloat16), leaf(24, 1, 4)
    y = short_conv(x, weight, backend=backend)
    expected = conv_loop(x.detach().cpu(), weight.detach().cpu(), None, None)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu().double(), expected, rtol=1e-2, atol=1e-2)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channels, width", [(37, 4), (130, 2), (20, 5)])
def test_decoding_step_advances_the_history_in_place(backend, channels, width):
    """Three tokens through ``short_conv_step`` (x a column slice of a wider row) equal the loop over the history
    and those tokens, and the buffer ends holding the last W − 1 inputs."""
    torch.manual_seed(channels + width)
    with torch.no_grad():
        wide, weight = leaf(3, 3, channels + 11), leaf(channels, 1, width)
        x = wide[..., 5 : 5 + channels]
        start = leaf(3, channels, width - 1)
        history = start.clone()
        steps = [short_conv_step(x[:, t : t + 1], weight, history, backend) for t in range(3)]
    expected = conv_loop(x.cpu(), weight.cpu(), start.cpu(), None)
    torch.testing.assert_close(torch.cat(steps, dim=1).cpu().double(), expected, rtol=0, atol=2e-5)
    inputs = torch.cat([start, x.transpose(1, 2)], dim=-1)
    torch.testing.assert_close(history, inputs[..., -(width - 1) :], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"short_conv_step: needs x \[B, 1, C\]"):
        short_conv_step(x, weight, history, backend)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("group, groups, rest", [(16, 4, 37), (100, 2, 130), (24, 3, 0)])
def test_decoding_step_normalizes_the_leading_groups(backend, dtype, group, groups, rest):
    """``normalize=(channels, group, eps)``: the step's first ``channels`` outputs L2-normalised per group of the
    output as stored (``l2_normalize`` of the plain step's output), the rest and the history as without it."""
    torch.manual_seed(group + rest)
    channels = group * groups + rest
    with torch.no_grad():
        wide, weight = leaf(3, 1, channels + 7).to(dtype), leaf(channels, 1, 4).to(dtype)
        x = wide[..., 3 : 3 + channels]
        start = leaf(3, channels, 3).to(dtype)
        plain_history, history = start.clone(), start.clone()
        plain = short_conv_step(x, weight, plain_history, backend)
        y = short_conv_step(x, weight, history, backend, normalize=(group * groups, group, 1e-6))
    keys = plain[..., : group * groups].unflatten(-1, (-1, group)).float()
    expected = (keys * torch.rsqrt(keys.square().sum(-1, keepdim=True) + 1e-6)).to(dtype).flatten(-2)
    tolerance = 0 if dtype == torch.float32 else 1e-2  # bf16: the fp32 sums' order may move a rounding by one ulp
    torch.testing.assert_close(y[..., : group * groups], expected, rtol=tolerance, atol=1e-6)
    torch.testing.assert_close(y[..., group * groups :], plain[..., group * groups :], rtol=0, atol=0)
    torch.testing.assert_close(history, plain_history, rtol=0, atol=0)
    with pytest.raises(ValueError, match="argument 'normalize' must be"):
        short_conv_step(x, weight, history, backend, normalize=(group * groups + 1, group, 1e-6))


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("with_history", [False, True], ids=["zeros", "history"])
def test_custom_op_registration(with_history):
    """Schema, autograd, fake implementation and AOT dispatch of ``linrnn::short_conv`` (``opcheck``)."""
    from linrnn.kernels.short_conv import short_conv_op

    torch.manual_seed(6)
    x, weight = leaf(2, 11, 9), leaf(9, 1, 4)
    history = leaf(2, 9, 3) if with_history else None
    results = torch.library.opcheck(short_conv_op, (x, weight, history, None, [2, 4, 3]))
    assert set(results.values()) == {"SUCCESS"}, results
