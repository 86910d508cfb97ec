"""The torch backend on CUDA against the fp64 CPU reference (run on the GPU machine; skipped without CUDA)."""

import warnings

import pytest
import torch

import linrnn
from tests.helpers import CELLS, OPS, assert_runs_match, forward_backward, make_inputs

pytestmark = pytest.mark.gpu
STREAMS = ("q", "k", "v", "a", "g", "beta", "b", "w")  # the [B, T, ...] inputs


@pytest.mark.parametrize("dtype, rtol", [(torch.float32, 1e-4), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("cell", CELLS)
def test_torch_backend_on_cuda(cell, dtype, rtol):
    inputs = make_inputs(cell, B=2, T=300, H=4, K=64, V=64, initial_state=True, dtype=dtype, seed=3)
    expected = forward_backward(cell, {n: x.double() for n, x in inputs.items()}, backend="reference")
    actual = forward_backward(cell, {n: x.cuda() for n, x in inputs.items()}, backend="torch")
    assert_runs_match(actual, expected, rtol)


def test_gdn2_auto_runs_the_triton_kernels_on_cuda(monkeypatch):
    """GDN-2's per-channel erase gate is in the Triton kernels: "auto" on CUDA takes them, with no warning, and matches
    the fp64 reference (outputs, final state, every gradient)."""
    from linrnn.kernels.triton import chunk

    calls = []
    forward = chunk.chunk_forward
    monkeypatch.setattr(chunk, "chunk_forward", lambda *a, **k: calls.append(1) or forward(*a, **k))
    inputs = make_inputs("gdn2", B=1, T=130, H=2, K=64, V=32, initial_state=True, seed=6)
    expected = forward_backward("gdn2", inputs, backend="reference")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        actual = forward_backward("gdn2", {n: x.float().cuda() for n, x in inputs.items()}, backend="auto")
    assert calls
    assert_runs_match(actual, expected, 1e-4)


def test_varlen_on_cuda():
    inputs = make_inputs("gammanet", B=1, T=200, H=2, K=32, V=32, initial_state=True, num_states=3, seed=4)
    cu_seqlens = torch.tensor([0, 7, 120, 200])
    expected = forward_backward("gammanet", inputs, backend="reference", cu_seqlens=cu_seqlens)
    actual = forward_backward(
        "gammanet", {n: x.cuda() for n, x in inputs.items()}, backend="torch", cu_seqlens=cu_seqlens.cuda()
    )
    assert_runs_match(actual, expected, 1e-10)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet"])
def test_cu_seqlens_on_the_host(cell, backend):
    """Boundaries on the CPU (no device sync) give the same outputs and gradients as on the GPU, and the reference."""
    inputs = make_inputs(cell, B=1, T=200, H=2, K=32, V=32, initial_state=True, num_states=4, seed=5)
    cu_seqlens = torch.tensor([0, 7, 120, 121, 200])
    expected = forward_backward(cell, inputs, backend="reference", cu_seqlens=cu_seqlens)
    on_gpu = {n: x.float().cuda() for n, x in inputs.items()}
    host = forward_backward(cell, on_gpu, backend=backend, cu_seqlens=cu_seqlens)
    device = forward_backward(cell, on_gpu, backend=backend, cu_seqlens=cu_seqlens.cuda())
    assert_runs_match(host, device, 1e-6)  # equal up to the order of atomic adds
    assert_runs_match(host, expected, 1e-4, atol=1e-5)
    with torch.no_grad():  # decoding lengths: the fused recurrent kernel
        short = {n: x[:, :40] if n in STREAMS else x for n, x in on_gpu.items()}
        short["initial_state"] = short["initial_state"][:3]
        bounds = torch.tensor([0, 3, 39, 40])
        host = OPS[cell](**short, cu_seqlens=bounds, backend="triton", output_final_state=True)
        device = OPS[cell](**short, cu_seqlens=bounds.cuda(), backend="triton", output_final_state=True)
    assert torch.equal(host[0], device[0]) and torch.equal(host[1], device[1])


@pytest.mark.parametrize("cell", CELLS)
def test_model_decode_on_cuda(cell, monkeypatch):
    """Decoding on CUDA runs the Triton fused recurrent kernel and reproduces the full forward (torch path)."""
    from linrnn.kernels.triton import fused_recurrent

    calls = []
    kernel = fused_recurrent.fused_recurrent_fwd
    monkeypatch.setattr(fused_recurrent, "fused_recurrent_fwd", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    torch.manual_seed(0)
    model = linrnn.build_model(cell).cuda()
    ids = torch.randint(0, 256, (2, 20), device="cuda")
    full = model(ids)  # with autograd: the torch chunked path
    assert not calls
    state, steps = None, []
    with torch.no_grad():
        for t in range(20):
            logits, state = model(ids[:, t : t + 1], state=state, return_state=True)
            steps.append(logits)
    assert len(calls) == 20 * model.config.num_layers
    torch.testing.assert_close(torch.cat(steps, 1), full, rtol=1e-4, atol=1e-4)
    generated = linrnn.generate(model, ids[:, :5], 8, temperature=0)
    assert generated.shape == (2, 13)


@pytest.mark.parametrize("cell", ["gated_deltanet", "kda", "gammanet"])
@pytest.mark.parametrize("head_v_dim", [48, 64])
def test_bf16_decode_through_the_matrix_vector_kernel(cell, head_v_dim, monkeypatch):
    """A bf16 model decoding on CUDA runs its products through ``linrnn.kernels.linear``'s matrix-vector kernel,
    each with the elementwise step before it in the kernel's prologue — the block's add + RMSNorm into the mixer's
    projection and into gate + up, SwiGLU into down, and the gated output norm into o_proj where its head width is
    a power of two (64; at 48 that norm runs on its own): the logits of 12 steps equal those with every step on its
    own and ``F.linear`` (cuBLAS), up to the order of the fp32 sums and the bf16 roundings the fused steps skip
    (carried through 2 layers)."""
    from linrnn.kernels import linear as linear_module
    from linrnn.kernels.triton import gemv

    kinds = []
    launch = gemv._launch
    monkeypatch.setattr(gemv, "_launch", lambda *a, **k: kinds.append(k.get("prologue", gemv.NONE).value)
                        or launch(*a, **k))  # fmt: skip
    torch.manual_seed(0)
    model = linrnn.build_model(cell, head_v_dim=head_v_dim).cuda().bfloat16().eval()
    ids = torch.randint(0, 256, (2, 12), device="cuda")

    def decode():
        state, steps = None, []
        with torch.no_grad():
            for t in range(ids.shape[1]):
                logits, state = model(ids[:, t : t + 1], state=state, return_state=True)
                steps.append(logits.float())
        return torch.cat(steps, 1)

    through_kernel = decode()
    output_norm = gemv.GATED_RMS_NORM if head_v_dim == 64 else gemv.NONE
    layer = [gemv.RMS_NORM, output_norm, gemv.RMS_NORM, gemv.SWIGLU]  # projection, o_proj, gate + up, down
    step = [kind.value for kind in layer * model.config.num_layers + [gemv.NONE]]  # ... and the readout
    assert kinds == step * ids.shape[1]
    monkeypatch.setattr(linear_module, "_takes_gemv", lambda *a: False)
    torch.testing.assert_close(through_kernel, decode(), rtol=2e-2, atol=2e-2)


def test_fused_recurrent_more_programs_than_grid_axis_1_allows():
    """70,000 sequences x 1 head: more than the 65,535 programs CUDA allows on grid axes 1 and 2."""
    inputs = make_inputs("gated_deltanet", B=70_000, T=2, H=1, K=16, V=16, initial_state=True, dtype=torch.float32)
    inputs = {n: x.float().cuda() for n, x in inputs.items()}
    with torch.no_grad():
        expected = linrnn.ops.gated_delta_rule(**inputs, output_final_state=True, backend="torch")
        actual = linrnn.ops.gated_delta_rule(**inputs, output_final_state=True, backend="triton")
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(actual[1], expected[1], rtol=1e-5, atol=1e-5)
