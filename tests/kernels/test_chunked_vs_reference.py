"""backend="torch" (chunkwise) against backend="reference" (sequential loop) in fp64, forward and every gradient."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.helpers import CELLS, OPS, assert_close, assert_runs_match, forward_backward, make_inputs


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("H", [1, 3])
@pytest.mark.parametrize("D", [32, 64, 100])
@pytest.mark.parametrize("T", [1, 63, 64, 65, 300])
@pytest.mark.parametrize("cell", CELLS)
def test_matches_reference_fp64(cell, T, D, H, with_state):
    inputs = make_inputs(cell, B=2, T=T, H=H, K=D, V=D, initial_state=with_state, seed=hash((cell, T, D, H)) % 2**31)
    expected = forward_backward(cell, inputs, backend="reference")
    for chunk_size in (16, 64):
        assert_runs_match(forward_backward(cell, inputs, backend="torch", chunk_size=chunk_size), expected, 1e-10)


@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("cell", CELLS)
def test_varlen_matches_reference(cell, with_state):
    lengths = [13, 64, 150]  # uneven: shorter than, equal to, and spanning several chunks
    inputs = make_inputs(
        cell, B=1, T=sum(lengths), H=3, K=40, V=24, initial_state=with_state, num_states=len(lengths), seed=7
    )
    cu_seqlens = torch.tensor([0, 13, 77, 227])
    expected = forward_backward(cell, inputs, backend="reference", cu_seqlens=cu_seqlens)
    for chunk_size in (16, 64):
        actual = forward_backward(cell, inputs, backend="torch", chunk_size=chunk_size, cu_seqlens=cu_seqlens)
        assert_runs_match(actual, expected, 1e-10)
    # each sequence alone gives the same output and state
    o, final, _ = expected
    for n, (start, end) in enumerate(zip(cu_seqlens[:-1].tolist(), cu_seqlens[1:].tolist(), strict=True)):
        piece = {name: x[:, start:end] if x.dim() >= 3 else x for name, x in inputs.items() if name != "initial_state"}
        if with_state:
            piece["initial_state"] = inputs["initial_state"][n : n + 1]
        alone = forward_backward(cell, piece, backend="torch")
        assert_close(alone[0], o[:, start:end], 1e-10, f"sequence {n} output")
        assert_close(alone[1], final[n : n + 1], 1e-10, f"sequence {n} final state")


def test_varlen_empty_sequence_keeps_initial_state():
    inputs = make_inputs("gated_deltanet", B=1, T=20, H=2, K=16, V=8, initial_state=True, num_states=3, seed=3)
    cu_seqlens = torch.tensor([0, 8, 8, 20])
    o, final, _ = forward_backward("gated_deltanet", inputs, backend="torch", cu_seqlens=cu_seqlens)
    assert torch.equal(final[1], inputs["initial_state"][1])
    expected = forward_backward("gated_deltanet", inputs, backend="reference", cu_seqlens=cu_seqlens)
    assert_runs_match((o, final, expected[2]), expected, 1e-10)


@settings(max_examples=25, deadline=None)
@given(
    cell=st.sampled_from(CELLS),
    T=st.integers(1, 90),
    chunk_size=st.integers(1, 80),
    K=st.integers(1, 20),
    V=st.integers(1, 12),
    seed=st.integers(0, 2**31 - 1),
)
def test_any_chunk_size_matches_reference(cell, T, chunk_size, K, V, seed):
    inputs = make_inputs(cell, B=1, T=T, H=2, K=K, V=V, initial_state=seed % 2 == 0, seed=seed)
    expected = forward_backward(cell, inputs, backend="reference")
    assert_runs_match(forward_backward(cell, inputs, backend="torch", chunk_size=chunk_size), expected, 1e-10)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cell", CELLS)
def test_low_precision_inputs(cell, dtype):
    """bf16/fp16 inputs, fp32 accumulation: within 1e-2 relative of the fp64 reference on the same
    (rounded) inputs, for outputs, final state and gradients (which come back in the input dtype)."""
    inputs = make_inputs(cell, B=2, T=200, H=2, K=64, V=64, initial_state=True, dtype=dtype, seed=11)
    rounded = {name: x.double() for name, x in inputs.items()}
    expected = forward_backward(cell, rounded, backend="reference")
    actual = forward_backward(cell, inputs, backend="torch")
    assert actual[0].dtype == dtype and actual[1].dtype == torch.float32
    assert actual[2]["q"].dtype == dtype
    assert_runs_match(actual, expected, 1e-2)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_extreme_gates(cell, dtype):
    """Log-decay down to −20 per step and beta at exactly 0 and 1 stay finite and correct."""
    inputs = make_inputs(cell, B=1, T=150, H=2, K=32, V=16, initial_state=True, dtype=dtype, seed=5)
    if "g" in inputs:
        inputs["g"] = torch.where(torch.rand(inputs["g"].shape) < 0.5, -20.0, 0.0).double()
    if "beta" in inputs:
        inputs["beta"] = (torch.rand(inputs["beta"].shape) < 0.5).double()
    expected = forward_backward(cell, {n: x.double() for n, x in inputs.items()}, backend="reference")
    actual = forward_backward(cell, inputs, backend="torch", chunk_size=64)
    assert_runs_match(actual, expected, 1e-10 if dtype == torch.float64 else 1e-4)


@pytest.mark.parametrize("used", ["output", "final_state"])
@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet"])
def test_loss_on_one_output_matches_reference(cell, used):
    """A loss of only the output or only the final state: the op's backward gets no gradient for the other (autograd
    does not fill zeros for it) and still gives every input's gradient of the fp64 loop."""
    inputs = make_inputs(cell, B=2, T=70, H=2, K=16, V=8, initial_state=True, seed=13)
    grads = {}
    for backend in ("reference", "torch"):
        leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
        o, final = OPS[cell](**leaves, output_final_state=True, backend=backend)
        picked = o if used == "output" else final
        weight = torch.randn(picked.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        (picked * weight).sum().backward()
        grads[backend] = {name: x.grad for name, x in leaves.items()}
    for name, expected in grads["reference"].items():
        actual = grads["torch"][name]
        if expected is None:  # q does not reach the final state: the loop leaves no gradient, the op zeros
            assert used == "final_state" and name == "q" and not actual.any(), f"grad of {name}"
            continue
        assert_close(actual, expected, 1e-10, f"grad of {name}")


def test_kept_forward_tensors_carry_no_gradient():
    """The custom op's kept tensors (chunk states, corrected values, intra-chunk matrices, write keys) are marked
    non-differentiable: autograd gives the backward None for them rather than zeros of their size."""
    from linrnn.kernels import library

    x = make_inputs("gated_deltanet", B=1, T=10, H=1, K=4, V=4, seed=2)
    leaves = {name: t.clone().requires_grad_(True) for name, t in x.items()}
    outputs = library.chunk_forward_op(leaves["q"], leaves["k"], None, leaves["v"], leaves["g"], leaves["beta"], None,
                                       None, None, None, True, 0.5, True, True, "torch", 0, False, False)  # fmt: skip
    assert outputs[0].requires_grad and outputs[1].requires_grad
    assert not any(t.requires_grad for t in outputs[2:])
