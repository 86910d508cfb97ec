"""The Triton fused recurrent (decode) kernel against the fp64 reference.

Compiled on CUDA; on a CPU-only machine it runs under ``TRITON_INTERPRET=1`` (set before the kernel is imported).
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

from linrnn import ops  # noqa: E402
from linrnn.kernels.triton import fused_recurrent  # noqa: E402
from tests.helpers import CELLS, OPS, assert_close, make_inputs, nan_filled, recorded_copies  # noqa: E402


def run(cell, inputs, **op_args):
    with torch.no_grad():
        return OPS[cell](**{n: x.to(DEVICE) for n, x in inputs.items()}, output_final_state=True, **op_args)


@pytest.fixture
def poisoned_outputs(monkeypatch):
    """Every output buffer starts as NaN, so an element the kernel does not write fails the comparison."""
    monkeypatch.setattr(fused_recurrent, "new_output", nan_filled)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("cell", ["gated_deltanet", "kda", "gammanet"])
def test_matches_reference_with_wide_value_blocks(cell, monkeypatch):
    """The launch shape for many sequences (64 value columns and 4 warps a program; here for any count), V not a
    multiple of the block, the state in and out."""
    monkeypatch.setattr(fused_recurrent, "MANY_PROGRAMS", 0)
    inputs = make_inputs(cell, B=3, T=2, H=2, K=20, V=72, initial_state=True, dtype=torch.float32, seed=5)
    inputs = {n: x.float() for n, x in inputs.items()}
    expected = OPS[cell](**{n: x.double() for n, x in inputs.items()}, output_final_state=True, backend="reference")
    o, final = run(cell, inputs, backend="triton")
    assert_close(o.cpu(), expected[0], 1e-5, "output")
    assert_close(final.cpu(), expected[1], 1e-5, "final state")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("with_state", [False, True], ids=["zero_state", "initial_state"])
@pytest.mark.parametrize("T, K, V", [(1, 16, 16), (7, 20, 12), (33, 64, 40)])
@pytest.mark.parametrize("cell", CELLS)
def test_matches_reference(cell, T, K, V, with_state):
    inputs = make_inputs(cell, B=2, T=T, H=3, K=K, V=V, initial_state=with_state, dtype=torch.float32, seed=T * K)
    inputs = {n: x.float() for n, x in inputs.items()}
    expected = OPS[cell](**{n: x.double() for n, x in inputs.items()}, output_final_state=True, backend="reference")
    o, final = run(cell, inputs, backend="triton")
    assert o.dtype == torch.float32 and final.dtype == torch.float32
    assert_close(o.cpu(), expected[0], 1e-5, "output")
    assert_close(final.cpu(), expected[1], 1e-5, "final state")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet"])
def test_varlen_and_bf16(cell):
    lengths = [3, 1, 9]
    inputs = make_inputs(cell, B=1, T=sum(lengths), H=2, K=32, V=24, initial_state=True, num_states=3,
                         dtype=torch.bfloat16, seed=5)  # fmt: skip
    inputs = {n: x if x.dtype == torch.bfloat16 else x.float() for n, x in inputs.items()}
    cu_seqlens = torch.tensor([0, 3, 4, 13])
    expected = OPS[cell](**{n: x.double() for n, x in inputs.items()}, output_final_state=True, backend="reference",
                         cu_seqlens=cu_seqlens)  # fmt: skip
    o, final = run(cell, inputs, backend="triton", cu_seqlens=cu_seqlens.to(DEVICE))
    assert o.dtype == torch.bfloat16
    assert_close(o.cpu(), expected[0], 1e-2, "output")
    assert_close(final.cpu(), expected[1], 1e-2, "final state")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("cell", CELLS)
def test_inputs_read_in_place_from_column_slices(cell):
    """q, k, v (and the erase direction) as column slices of one wider [B, T, C] matrix — how the mixers' short
    conv hands them over — are read where they are (no copies) and give the contiguous inputs' result."""
    inputs = make_inputs(cell, B=3, T=5, H=2, K=16, V=24, initial_state=True, dtype=torch.float32, seed=11)
    inputs = {n: x.float().to(DEVICE) for n, x in inputs.items()}
    expected = run(cell, inputs, backend="triton")
    streams = [n for n in ("q", "k", "v", "a") if n in inputs]
    wide = torch.cat([inputs[n].flatten(2) for n in streams] + [torch.randn(3, 5, 7, device=DEVICE)], dim=-1)
    sliced, start = dict(inputs), 0
    for n in streams:
        width = inputs[n][0, 0].numel()
        sliced[n] = wide[..., start : start + width].unflatten(-1, inputs[n].shape[2:])
        start += width
        assert not sliced[n].is_contiguous()
    with recorded_copies() as copied:
        o, final = run(cell, sliced, backend="triton")
    assert not copied, f"copied: {copied}"
    torch.testing.assert_close(o, expected[0], rtol=0, atol=0)
    torch.testing.assert_close(final, expected[1], rtol=0, atol=0)


def test_triton_backend_errors():
    inputs = {n: x.float().to(DEVICE) for n, x in make_inputs("kda", B=1, T=4, H=1, K=8, V=8).items()}
    with pytest.raises(ValueError, match="backend 'triton' computes in fp32, got float64 inputs"):
        ops.kda(**{n: x.double() for n, x in inputs.items()}, backend="triton")
    wide = make_inputs("deltanet", B=1, T=2, H=1, K=300, V=8, dtype=torch.float32)
    with pytest.raises(ValueError, match="backend 'triton' supports K and V up to 256, got K = 300, V = 8"):
        ops.delta_rule(**{n: x.float().to(DEVICE) for n, x in wide.items()}, backend="triton")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend, T", [("triton", 5), ("torch", 5), ("triton", 70)], ids=["fused", "torch", "chunk"])
@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet"])
def test_update_state_in_place(cell, backend, T):
    """The final state is written into the initial-state buffer (the fused kernel reads each tile before it writes
    it; the other paths copy) and returned; it equals the fp64 reference."""
    inputs = make_inputs(cell, B=2, T=T, H=2, K=16, V=24, initial_state=True, dtype=torch.float32, seed=T)
    inputs = {n: x.float() for n, x in inputs.items()}
    expected = OPS[cell](**{n: x.double() for n, x in inputs.items()}, output_final_state=True, backend="reference")
    with torch.no_grad():
        moved = {n: x.to(DEVICE) for n, x in inputs.items()}
        buffer = moved["initial_state"]
        o, final = OPS[cell](**moved, backend=backend, update_state_in_place=True)
    assert final is buffer
    assert_close(o.cpu(), expected[0], 1e-5, "output")
    assert_close(buffer.cpu(), expected[1], 1e-5, "state buffer")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", ["triton", "torch"], ids=["fused", "torch"])
@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet", "gdn2"])
def test_update_state_in_place_in_bf16(cell, backend):
    """A bf16 state buffer (a decoding engine's ``state_dtype``): read into fp32, the steps computed in fp32, the
    new state rounded once into the buffer — the fp64 reference from the same (bf16) state, rounded."""
    inputs = make_inputs(cell, B=2, T=3, H=2, K=16, V=24, initial_state=True, dtype=torch.float32, seed=4)
    inputs = {n: x.float() for n, x in inputs.items()}
    inputs["initial_state"] = inputs["initial_state"].bfloat16()
    reference = {n: x.double() for n, x in inputs.items()}
    expected = OPS[cell](**reference, output_final_state=True, backend="reference")
    with torch.no_grad():
        moved = {n: x.to(DEVICE) for n, x in inputs.items()}
        buffer = moved["initial_state"]
        o, final = OPS[cell](**moved, backend=backend, update_state_in_place=True)
    assert final is buffer and buffer.dtype == torch.bfloat16
    assert_close(o.cpu(), expected[0], 1e-5, "output")
    rounded = expected[1].bfloat16()
    differs = buffer.cpu() != rounded  # at most a rounding boundary apart: one bf16 step
    assert (differs.float().mean() < 0.01) and torch.allclose(buffer.cpu().double(), expected[1], rtol=2**-8, atol=0)


def test_update_state_in_place_errors():
    inputs = {
        n: x.float().to(DEVICE) for n, x in make_inputs("kda", B=1, T=3, H=1, K=8, V=8, initial_state=True).items()
    }
    without = {n: x for n, x in inputs.items() if n != "initial_state"}
    with pytest.raises(ValueError, match="needs argument 'initial_state'"):
        ops.kda(**without, update_state_in_place=True)
    with pytest.raises(
        ValueError, match=r"contiguous torch.float32 \(or torch.bfloat16\) 'initial_state', got a non-con"
    ):
        state = inputs["initial_state"].transpose(-1, -2).contiguous().transpose(-1, -2)
        ops.kda(**without, initial_state=state, update_state_in_place=True)
    with pytest.raises(ValueError, match="is for inference"):
        ops.kda(**{**inputs, "v": inputs["v"].requires_grad_()}, update_state_in_place=True)
