"""Random inputs per cell and a forward+backward harness shared by the kernel tests."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

import linrnn

CELLS = linrnn.list_cells()  # every registered recurrence cell
OPS = {cell: linrnn.get_cell(cell).op for cell in CELLS}


def make_inputs(
    cell, *, B, T, H, K, V, dtype=torch.float64, initial_state=False, num_states=None, seed=0, gate_bias=2.0
):
    """Admissible random inputs for the cell's structure: unit keys and erase directions, g = logsigmoid(N(0,1) +
    gate_bias), beta and b ~ U(0, 2), w ~ U(0, 1), log_gamma ~ N(0, 0.25)."""
    structure = linrnn.get_cell(cell).structure
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    def rand(*shape):
        return torch.rand(*shape, generator=gen, dtype=torch.float64)

    inputs = {"q": randn(B, T, H, K), "k": F.normalize(randn(B, T, H, K), dim=-1), "v": randn(B, T, H, V)}
    make = {
        "a": lambda: F.normalize(randn(B, T, H, K), dim=-1),
        "g": lambda: F.logsigmoid(randn(B, T, H, *((K,) if structure.decay == "channel" else ())) + gate_bias),
        "beta": lambda: 2 * rand(B, T, H),
        "b": lambda: 2 * rand(B, T, H, K),
        "w": lambda: rand(B, T, H, V),
        "log_gamma": lambda: 0.5 * randn(H, K),
    }
    for name in structure.input_names():
        inputs[name] = make[name]()
    if initial_state:
        inputs["initial_state"] = randn(num_states or B, H, K, V)
    for name in ("q", "k", "v", "a"):
        if name in inputs:
            inputs[name] = inputs[name].to(dtype)
    return inputs


def forward_backward(cell, inputs, seed=1, **op_args):
    """Runs the cell's op with gradients on every input; loss = <o, do> + <S_T, dS>.
    Returns (o, final state, {input name: grad}), all moved to the CPU."""
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    o, final = OPS[cell](**leaves, output_final_state=True, **op_args)
    gen = torch.Generator().manual_seed(seed)
    d_o = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)
    d_final = torch.randn(final.shape, generator=gen, dtype=torch.float64).to(o.device)
    (o.double() * d_o).sum().add((final.double() * d_final).sum()).backward()
    return o.detach().cpu(), final.detach().cpu(), {name: x.grad.cpu() for name, x in leaves.items()}


def assert_close(actual, expected, rtol, name, atol=1e-13):
    """Relative error in norm: ||actual − expected|| <= rtol ||expected|| + atol (atol only matters at 0)."""
    assert actual.shape == expected.shape, f"{name}: shape {list(actual.shape)} != {list(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{name}: non-finite values"
    error = (actual.double() - expected.double()).norm().item()
    scale = expected.double().norm().item()
    assert error <= rtol * scale + atol, f"{name}: relative error {error / max(scale, 1e-300):.3e} > {rtol:g}"


def assert_runs_match(actual, expected, rtol, atol=1e-13):
    """Compares (o, final_state, grads) of two ``forward_backward`` runs."""
    assert_close(actual[0], expected[0], rtol, "output", atol)
    assert_close(actual[1], expected[1], rtol, "final state", atol)
    assert actual[2].keys() == expected[2].keys()
    for name in expected[2]:
        assert_close(actual[2][name], expected[2][name], rtol, f"grad of {name}", atol)


def nan_filled(shape, dtype, device):
    """A stand-in for the kernels' ``new_output``: buffers start as NaN, so an element a kernel does not write
    fails the comparison that follows."""
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


@contextlib.contextmanager
def recorded_copies():
    """Records the shape of every non-contiguous tensor ``.contiguous()`` copies inside the block (a list)."""
    copied, original = [], torch.Tensor.contiguous

    def contiguous(x, *args, **kwargs):
        if not x.is_contiguous():
            copied.append(tuple(x.shape))
        return original(x, *args, **kwargs)

    torch.Tensor.contiguous = contiguous
    try:
        yield copied
    finally:
        torch.Tensor.contiguous = original
