"""The loss path: ``linear_cross_entropy`` and ``LanguageModel.loss`` equal ``cross_entropy`` of the logits — loss
and every gradient, fp64, chunk sizes that do and do not divide the tokens, ignored targets, a logit bias and
multiplier, tied and untied readouts, packed documents; also compiled, and under bf16 autocast."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import linrnn
from linrnn.kernels.cross_entropy import linear_cross_entropy, linear_cross_entropy_op
from tests.helpers import CELLS


def grads_of(loss, tensors):
    return torch.autograd.grad(loss, tensors)


@pytest.mark.parametrize("chunk_tokens", [1, 7, 64, None])
@pytest.mark.parametrize("with_bias", [False, True])
def test_matches_cross_entropy_of_the_logits(chunk_tokens, with_bias):
    gen = torch.Generator().manual_seed(chunk_tokens or 0)
    hidden = torch.randn(3, 13, 10, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(37, 10, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(37, dtype=torch.float64, generator=gen, requires_grad=True) if with_bias else None
    targets = torch.randint(0, 37, (3, 13), generator=gen)
    targets[0, :4] = -100  # ignored
    targets[2, 5] = -100
    inputs = [hidden, weight] + ([bias] if with_bias else [])

    logits = 0.7 * hidden @ weight.T + (bias if with_bias else 0)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    loss = linear_cross_entropy(hidden, weight, targets, bias=bias, multiplier=0.7, chunk_tokens=chunk_tokens)
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    for got, want in zip(grads_of(3 * loss, inputs), grads_of(3 * expected, inputs), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_all_ignored_gives_zero_and_no_grad_needs_no_gradients():
    hidden, weight = torch.randn(4, 5, requires_grad=True), torch.randn(9, 5, requires_grad=True)
    loss = linear_cross_entropy(hidden, weight, torch.full((4,), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert hidden.grad.abs().max() == 0 and weight.grad.abs().max() == 0
    with torch.no_grad():
        value = linear_cross_entropy(hidden, weight, torch.tensor([1, 2, 3, 4]))
    assert torch.isclose(value, F.cross_entropy(hidden @ weight.T, torch.tensor([1, 2, 3, 4])))


def test_bad_targets():
    with pytest.raises(ValueError, match=r"'targets' must have hidden's leading shape \[2, 3\], got \[2, 4\]"):
        linear_cross_entropy(torch.randn(2, 3, 5), torch.randn(7, 5), torch.zeros(2, 4, dtype=torch.long))
    model = linrnn.build_model("gdn")
    with pytest.raises(ValueError, match="'targets' must be an integer tensor of input_ids' shape"):
        model.loss(torch.zeros(2, 5, dtype=torch.long), torch.zeros(2, 5))


def test_custom_op_registration():
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(11, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(13, 6, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(13, dtype=torch.float64, generator=gen, requires_grad=True)
    targets = torch.randint(0, 13, (11,), generator=gen)
    for bias_arg, multiplier, chunk in [(bias, 0.5, 4), (None, 1.0, 5)]:
        args = (hidden, weight, targets, bias_arg, multiplier, -100, chunk, True, False)
        results = torch.library.opcheck(linear_cross_entropy_op, args)
        assert set(results.values()) == {"SUCCESS"}, results


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("vocab, chunk_tokens", [(37, 7), (5000, None)])  # 5000: more than one block of columns
def test_triton_rows_kernel_matches_cross_entropy(vocab, chunk_tokens, with_bias):
    """The fused Triton softmax/loss/dz kernel (interpreter on a CPU) against ``cross_entropy`` in fp64, fp32 inputs:
    loss and the gradients of hidden, weight and bias, with ignored targets and a multiplier."""
    pytest.importorskip("triton")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator().manual_seed(vocab)
    hidden = torch.randn(2, 9, 16, generator=gen)
    weight, bias = torch.randn(vocab, 16, generator=gen), torch.randn(vocab, generator=gen)
    targets = torch.randint(0, vocab, (2, 9), generator=gen)
    targets[1, 2:5] = -100
    leaves = [t.to(device).requires_grad_() for t in (hidden, weight, *([bias] if with_bias else []))]
    loss = linear_cross_entropy(leaves[0], leaves[1], targets.to(device), bias=leaves[2] if with_bias else None,
                                multiplier=0.3, chunk_tokens=chunk_tokens, backend="triton")  # fmt: skip
    grads = grads_of(loss, leaves)
    exact = [t.detach().cpu().double().requires_grad_() for t in leaves]
    logits = 0.3 * exact[0] @ exact[1].T + (exact[2] if with_bias else 0)
    expected = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=-100)
    torch.testing.assert_close(loss.cpu().double(), expected, rtol=1e-5, atol=0)
    for got, want in zip(grads, grads_of(expected, exact), strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=1e-5 * max(1.0, want.abs().max().item()))


@pytest.mark.gpu
@pytest.mark.parametrize("chunk_tokens", [5, None])
def test_triton_rows_bf16_under_autocast_matches_fp64(chunk_tokens):
    """The CUDA path under bf16 autocast, several chunks: each chunk's weight gradient is accumulated into the fp32
    sum by the GEMM itself (``addmm`` with an fp32 output); loss and gradients against fp64 of the same bf16-rounded
    inputs, to bf16's resolution."""
    pytest.importorskip("triton")
    gen = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 11, 64, generator=gen).bfloat16().float()
    weight = (0.1 * torch.randn(300, 64, generator=gen)).bfloat16().float()
    targets = torch.randint(0, 300, (3, 11), generator=gen)
    leaves = [t.cuda().requires_grad_() for t in (hidden, weight)]
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = linear_cross_entropy(leaves[0], leaves[1], targets.cuda(), chunk_tokens=chunk_tokens, backend="triton")
    grads = grads_of(loss, leaves)
    exact = [t.detach().cpu().double().requires_grad_() for t in (hidden, weight)]
    expected = F.cross_entropy((exact[0] @ exact[1].T).flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss.cpu().double(), expected, rtol=1e-2, atol=0)
    for got, want in zip(grads, grads_of(expected, exact), strict=True):
        error = (got.cpu().double() - want).norm() / want.norm()
        assert error < 1e-2, f"relative error {error:.2e}"


def model_gradients(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("cell", CELLS)
def test_model_loss_equals_cross_entropy_of_the_forward(cell):
    """Untied readout with a logit bias and multiplier (the muP readout), packed documents; fp64."""
    torch.manual_seed(0)
    model = linrnn.build_model(cell, tie_embeddings=False, readout_bias=True, logit_multiplier=0.25).double()
    with torch.no_grad():
        model.logit_bias.normal_()
    ids, targets = torch.randint(0, 256, (2, 21)), torch.randint(0, 256, (2, 21))
    targets[1, -3:] = -100
    positions = torch.cat([torch.arange(8), torch.arange(13)]).expand(2, 21)

    expected = F.cross_entropy(model(ids, positions=positions).flatten(0, 1), targets.flatten())
    expected.backward()
    want = model_gradients(model)
    model.zero_grad()
    loss = model.loss(ids, targets, positions=positions)
    loss.backward()
    torch.testing.assert_close(loss, expected, rtol=1e-12, atol=0)
    for name, grad in model_gradients(model).items():
        torch.testing.assert_close(grad, want[name], rtol=1e-9, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_tied_readout_under_compile_and_autocast():
    """Tied embeddings: the readout's gradient adds to the embedding's. Compiled equals eager (fp32), and under bf16
    autocast the loss stays within bf16 rounding of the fp32 one."""
    torch.manual_seed(0)
    model = linrnn.build_model("kda", backend="torch")
    ids, targets = torch.randint(0, 256, (2, 19)), torch.randint(0, 256, (2, 19))
    twin = copy.deepcopy(model)
    compiled = torch.compile(twin.loss, fullgraph=True, backend="aot_eager")
    results = []
    for run, parameters in ((model.loss, model), (compiled, twin)):
        parameters.zero_grad()
        loss = run(ids, targets)
        loss.backward()
        results.append((loss.detach(), model_gradients(parameters)))
    (loss, grads), (compiled_loss, compiled_grads) = results
    torch.testing.assert_close(compiled_loss, loss, rtol=1e-5, atol=0)
    for name, grad in grads.items():
        assert torch.linalg.norm(compiled_grads[name] - grad) <= 1e-5 * torch.linalg.norm(grad), name
    expected = F.cross_entropy(model(ids).flatten(0, 1), targets.flatten())
    torch.testing.assert_close(loss, expected, rtol=1e-5, atol=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = model.loss(ids, targets)
    assert low.dtype == torch.float32 and abs(low.item() - loss.item()) < 2e-2 * loss.item()
