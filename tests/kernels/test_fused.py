"""The fused gated RMSNorm and SwiGLU (Triton and torch paths) against fp64 formulas written out here: outputs and
every gradient, odd sizes, a gate read in place from a column slice, NaN-poisoned outputs, the custom ops'
registration. The Triton kernels run compiled on CUDA and under ``TRITON_INTERPRET=1`` on a CPU-only machine."""

import importlib.util
import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first

from linrnn.kernels.fused import (  # noqa: E402
    gated_rms_norm,
    l2_normalize,
    mamba_gates,
    mamba_log_decay,
    rms_norm,
    swiglu,
)
from tests.helpers import nan_filled, recorded_copies  # noqa: E402

HAS_TRITON = importlib.util.find_spec("triton") is not None
BACKENDS = ["torch", pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="needs triton"))]


def gated_norm_formula(x, z, weight, eps, gate="silu"):
    rms = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    return x / rms * weight * (torch.sigmoid(z) if gate == "sigmoid" else z * torch.sigmoid(z))


def leaf(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=torch.float64).to(dtype).to(DEVICE).requires_grad_()


def check_against_formula(fn, formula, inputs, atol, dtype_out):
    y = fn(*inputs)
    assert y.dtype == dtype_out and not y.isnan().any()
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    dy = torch.randn(y.shape, dtype=torch.float64)
    grads = torch.autograd.grad(y, tensors, dy.to(y.dtype).to(DEVICE))
    exact = [t.detach().cpu().double().requires_grad_() for t in tensors]
    expected = formula(*exact, *[a for a in inputs if not isinstance(a, torch.Tensor)])
    expected_grads = torch.autograd.grad(expected, exact, dy)
    torch.testing.assert_close(y.cpu().double(), expected, rtol=0, atol=atol)
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=atol * max(want.abs().max().item(), 1))


@pytest.fixture
def poisoned_outputs(monkeypatch):
    if not HAS_TRITON:
        return
    from linrnn.kernels.triton import fused as kernels

    monkeypatch.setattr(kernels, "new_output", nan_filled)


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("gate", ["silu", "sigmoid"])
@pytest.mark.parametrize("shape", [(2, 7, 3, 20), (1, 33, 2, 64), (3, 1, 1, 5)])
def test_gated_norm_matches_formula(backend, shape, gate):
    torch.manual_seed(sum(shape))
    x, z, weight = leaf(*shape), leaf(*shape), leaf(shape[-1])
    check_against_formula(lambda *a: gated_rms_norm(*a[:4], backend=backend, gate=a[4]), gated_norm_formula,
                          (x, z, weight, 1e-6, gate), atol=2e-5, dtype_out=torch.float32)  # fmt: skip


def test_gated_norm_refuses_an_unknown_gate():
    with pytest.raises(ValueError, match="argument 'gate' must be one of \\('silu', 'sigmoid'\\), got 'tanh'"):
        gated_rms_norm(leaf(1, 2, 1, 4), leaf(1, 2, 1, 4), leaf(4), 1e-6, gate="tanh")


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_norm_reads_a_gate_slice_in_place(backend):
    """The gate is a column slice of the mixer's one projection GEMM: [B, T, H·D] inside a wider row."""
    torch.manual_seed(1)
    x, weight = leaf(2, 9, 3, 16), leaf(16)
    wide = leaf(2, 9, 70)
    z = wide[..., 10:58].unflatten(-1, (3, 16))
    assert not z.is_contiguous()
    check_against_formula(lambda *a: gated_rms_norm(*a, backend=backend), gated_norm_formula, (x, z, weight, 1e-5),
                          atol=2e-5, dtype_out=torch.float32)  # fmt: skip


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_gated_norm_bf16(backend):
    torch.manual_seed(2)
    x, z, weight = leaf(2, 11, 2, 32, dtype=torch.bfloat16), leaf(2, 11, 2, 32, dtype=torch.bfloat16), leaf(32)
    y = gated_rms_norm(x, z, weight, 1e-6, backend=backend)
    expected = gated_norm_formula(x.detach().cpu().double(), z.detach().cpu().double(), weight.detach().cpu().double(),
                                  1e-6)  # fmt: skip
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.cpu().double(), expected, rtol=1e-2, atol=1e-2)


def swiglu_formula(both):
    a, b = both.chunk(2, dim=-1)
    return a * torch.sigmoid(a) * b


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(3, 5, 14), (2, 2200)])
def test_swiglu_matches_formula(backend, shape):
    """Output and the one gradient of both halves (written together by the Triton backward) against fp64."""
    torch.manual_seed(3)
    check_against_formula(lambda both: swiglu(both, backend=backend), swiglu_formula, (leaf(*shape),), atol=2e-6,
                          dtype_out=torch.float32)  # fmt: skip


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_swiglu_reads_a_column_slice_in_place(backend):
    """Both halves as a column slice of a wider matrix ``[B, T, 2I + 6]`` (rows 2I + 6 apart): no copy, the formula,
    and the gradient lands in the slice's columns only."""
    torch.manual_seed(4)
    wide = leaf(3, 2, 2 * 37 + 6)
    both = wide[..., : 2 * 37]
    with torch.no_grad(), recorded_copies() as copies:
        y = swiglu(both, backend=backend)
    assert copies == []
    expected = swiglu_formula(both.detach().double().cpu())
    torch.testing.assert_close(y.double().cpu(), expected, rtol=1e-6, atol=1e-6)
    swiglu(both, backend=backend).sum().backward()
    exact = both.detach().double().cpu().requires_grad_()
    swiglu_formula(exact).sum().backward()
    torch.testing.assert_close(wide.grad[..., : 2 * 37].double().cpu(), exact.grad, rtol=1e-6, atol=1e-6)
    assert (wide.grad[..., 2 * 37 :] == 0).all()


def test_swiglu_rejects_an_odd_width():
    with pytest.raises(ValueError, match="argument 'both' must have an even last dim, got shape \\[2, 7\\]"):
        swiglu(torch.zeros(2, 7))


def rms_formula(x, weight, eps):
    return x / (x.pow(2).mean(-1, keepdim=True) + eps).sqrt() * weight


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(2, 7, 40), (1, 3, 1024)])
def test_rms_norm_matches_formula(backend, shape):
    torch.manual_seed(7)
    x, weight = leaf(*shape), leaf(shape[-1])
    check_against_formula(lambda *a: rms_norm(*a, backend=backend), rms_formula, (x, weight, 1e-6), atol=2e-5,
                          dtype_out=torch.float32)  # fmt: skip


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("delta_dtype", [torch.float32, torch.bfloat16])
def test_residual_add_and_rms_norm(backend, delta_dtype):
    """``(norm(x + delta), x + delta)`` with gradients flowing into both outputs, as in a block (the sum goes on
    as the residual stream): the gradients of x, delta and the weight against fp64."""
    torch.manual_seed(8)
    x, delta, weight = leaf(3, 5, 48), leaf(3, 5, 48, dtype=delta_dtype), leaf(48)
    normed, total = rms_norm(x, weight, 1e-6, delta, backend=backend)
    assert normed.dtype == total.dtype == torch.float32 and not normed.isnan().any() and not total.isnan().any()
    d_normed, d_total = torch.randn(normed.shape, dtype=torch.float64), torch.randn(total.shape, dtype=torch.float64)
    outputs = (normed, total)
    grads = torch.autograd.grad(outputs, (x, delta, weight), [g.float().to(DEVICE) for g in (d_normed, d_total)])
    exact = [t.detach().cpu().double().requires_grad_() for t in (x, delta, weight)]
    exact_total = exact[0] + exact[1]
    expected = (rms_formula(exact_total, exact[2], 1e-6), exact_total)
    for got, want in zip(outputs, expected, strict=True):
        torch.testing.assert_close(got.cpu().double(), want, rtol=0, atol=2e-5)
    expected_grads = torch.autograd.grad(expected, exact, (d_normed, d_total))
    assert grads[1].dtype == delta_dtype
    for got, want in zip(grads, expected_grads, strict=True):
        tolerance = 1e-2 if got.dtype == torch.bfloat16 else 2e-5
        torch.testing.assert_close(got.cpu().double(), want, rtol=tolerance, atol=tolerance * want.abs().max().item())


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
def test_rms_norm_output_in_the_autocast_dtype():
    """Under autocast the Triton path returns what the next GEMM reads (bf16); the residual sum stays fp32."""
    x, delta, weight = leaf(2, 4, 32), leaf(2, 4, 32), leaf(32)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        normed, total = rms_norm(x, weight, 1e-6, delta, backend="triton")
        alone = rms_norm(x, weight, 1e-6, backend="triton")
    assert normed.dtype == alone.dtype == torch.bfloat16 and total.dtype == torch.float32
    torch.testing.assert_close(normed.double(), rms_formula((x + delta).double(), weight.double(), 1e-6),
                               rtol=1e-2, atol=1e-2)  # fmt: skip


def l2_formula(x, eps):
    return x / (x.square().sum(-1, keepdim=True) + eps).sqrt()


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", [(2, 9, 3, 20), (1, 17, 2, 128)])
def test_l2_normalize_matches_formula(backend, shape):
    torch.manual_seed(5)
    x = torch.randn(*shape, dtype=torch.float64)
    x[0, 0, 0] = 1e-9  # a row far below eps: y ≈ x / sqrt(eps)
    x[0, 1, 0] *= 1e-3  # a row whose squared norm is near eps: where eps's place in the formula shows
    x = x.float().to(DEVICE).requires_grad_()
    check_against_formula(lambda x, eps: l2_normalize(x, eps, torch.float32, backend), l2_formula, (x, 1e-6),
                          atol=2e-6, dtype_out=torch.float32)  # fmt: skip


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_l2_normalize_reads_a_column_slice_in_place(backend):
    """Heads of a column slice of a wider [B, T, C] matrix (the mixers' short-conv output): the formula's output
    and gradient, and on the Triton path no copy of the slice, forward or backward."""
    torch.manual_seed(7)
    wide = torch.randn(2, 9, 3 * 20 + 11, dtype=torch.float64).float().to(DEVICE).requires_grad_()
    with recorded_copies() as copied:
        check_against_formula(lambda w, eps: l2_normalize(w[..., 5:65].unflatten(-1, (3, 20)), eps, torch.float32,
                                                          backend),
                              lambda w, eps: l2_formula(w[..., 5:65].unflatten(-1, (3, 20)), eps), (wide, 1e-6),
                              atol=2e-6, dtype_out=torch.float32)  # fmt: skip
    assert not copied or backend == "torch", copied


@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
def test_l2_normalize_returns_the_requested_dtype(backend):
    torch.manual_seed(6)
    x = leaf(2, 5, 2, 32, dtype=torch.bfloat16)
    y = l2_normalize(x, 1e-6, torch.float32, backend)
    assert y.dtype == torch.float32
    torch.testing.assert_close(y.cpu().double(), l2_formula(x.detach().cpu().double(), 1e-6), rtol=0, atol=1e-6)
    z = l2_normalize(leaf(3, 4, 64), 1e-6, torch.bfloat16, backend)
    assert z.dtype == torch.bfloat16


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_mamba_log_decay_matches_formula(backend, per_channel):
    """The decoding kernel (no autograd) against the fp64 formula, pre from -40 to 40 (softplus's two tails) and,
    per head, read in place from a column slice of a wider matrix, as GDN's gate comes out of the projection."""
    torch.manual_seed(9)
    heads, channels = 3, 5
    if per_channel:
        pre = torch.randn(2, 7, heads, channels) * 15
        a_log, dt_bias = torch.randn(heads, 1), torch.randn(heads, channels)
    else:
        pre = (torch.randn(2, 7, 11) * 15)[..., 4 : 4 + heads]
        a_log, dt_bias = torch.randn(heads), torch.randn(heads)
    pre[0, 0, 0], pre[0, 1, 0], pre[0, 2, 0] = -40.0, 40.0, -12.0
    summed = (pre + dt_bias).double()  # the op adds in fp32 (|x| ≤ 40: up to 2.4e-6 absolute); the rest in fp64
    expected = -a_log.double().exp() * torch.nn.functional.softplus(summed)
    with torch.no_grad():
        g = mamba_log_decay(pre.to(DEVICE), a_log.to(DEVICE), dt_bias.to(DEVICE), backend)
    assert g.dtype == torch.float32 and g.shape == pre.shape
    torch.testing.assert_close(g.cpu().double(), expected, rtol=1e-6, atol=0)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.usefixtures("poisoned_outputs")
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("beta_scale", [1.0, 2.0])
@pytest.mark.parametrize("per_channel", [False, True], ids=["per_head", "per_channel"])
def test_mamba_gates_match_formula(backend, beta_scale, per_channel):
    """The log-decay and the write strength β = scale · sigmoid(b) from one decoding launch against the fp64
    formulas, β's pre-activation from -40 to 40 and read in place from a column slice of a wider matrix (as GDN's and
    KDA's come out of the projection); bf16 inputs as in a bf16 model."""
    torch.manual_seed(10)
    heads, channels = 3, 4
    projection = torch.randn(2, 7, 13) * 15
    projection[0, 0, 9], projection[0, 1, 9], projection[0, 2, 9] = -40.0, 40.0, -12.0
    projection = projection.to(torch.bfloat16)
    beta_pre = projection[..., 9 : 9 + heads]
    if per_channel:
        pre = (torch.randn(2, 7, heads, channels) * 15).to(torch.bfloat16)
        a_log, dt_bias = torch.randn(heads, 1), torch.randn(heads, channels)
    else:
        pre = projection[..., 2 : 2 + heads]
        a_log, dt_bias = torch.randn(heads), torch.randn(heads)
    summed = (pre.float() + dt_bias).double()  # the op adds in fp32; the rest in fp64
    expected_g = -a_log.double().exp() * torch.nn.functional.softplus(summed)
    expected_beta = beta_scale * beta_pre.double().sigmoid()
    with torch.no_grad():
        g, beta = mamba_gates(*(t.to(DEVICE) for t in (pre, a_log, dt_bias, beta_pre)), beta_scale, backend)
    assert g.dtype == beta.dtype == torch.float32 and g.shape == pre.shape and beta.shape == beta_pre.shape
    torch.testing.assert_close(g.cpu().double(), expected_g, rtol=1e-6, atol=0)
    torch.testing.assert_close(beta.cpu().double(), expected_beta, rtol=1e-6, atol=0)


@pytest.mark.skipif(not HAS_TRITON, reason="needs triton")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(2, 21, 3, 20), (1, 37, 2, 128)], ids=["odd", "K128"])
def test_gammanet_fold_kernels_match_formula(poisoned_outputs, dtype, shape):
    """GammaNet's fold and its backward in one launch each way (``triton.fused.fold_forward/backward``) against the
    formulas in fp64 from the same rounded operands: Γq and Γ⁻¹w rounded once to the input dtype; dq, dw from fp32
    gradients; d log Γ = Σ_{B,T} Γq ⊙ d(Γq) − Γ⁻¹w ⊙ d(Γ⁻¹w). Rows and columns not multiples of the tile."""
    from linrnn.kernels.triton.fused import fold_backward, fold_forward

    torch.manual_seed(sum(shape))
    q, w = (torch.randn(*shape).to(dtype).to(DEVICE) for _ in range(2))
    gamma = (0.5 * torch.randn(shape[2:])).exp().to(DEVICE)
    folded_q, folded_w = fold_forward(q, w, gamma)
    exact_gamma = gamma.cpu().double()
    assert folded_q.dtype == folded_w.dtype == dtype
    # one rounding to the input dtype: within one unit in the last place (the interpreter's bf16 cast truncates)
    ulp = 2.0**-7 if dtype == torch.bfloat16 else 2.0**-23
    for got, want in ((folded_q, q.cpu().double() * exact_gamma), (folded_w, w.cpu().double() / exact_gamma)):
        torch.testing.assert_close(got.cpu().double(), want, rtol=ulp, atol=0)
    d_folded_q, d_folded_w = (torch.randn(*shape).to(DEVICE) for _ in range(2))
    dq, dw, d_log_gamma = fold_backward(folded_q, folded_w, gamma, d_folded_q, d_folded_w, (dtype, dtype))
    assert dq.dtype == dw.dtype == dtype and d_log_gamma.dtype == torch.float32 and d_log_gamma.shape == gamma.shape
    fq, fw, dfq, dfw = (t.cpu().double() for t in (folded_q, folded_w, d_folded_q, d_folded_w))
    torch.testing.assert_close(dq.cpu().double(), dfq * exact_gamma, rtol=ulp, atol=0)
    torch.testing.assert_close(dw.cpu().double(), dfw / exact_gamma, rtol=ulp, atol=0)
    expected = (fq * dfq - fw * dfw).sum((0, 1))
    scale = (fq * dfq).abs().sum((0, 1)) + (fw * dfw).abs().sum((0, 1))  # fp32 sums: error relative to Σ|terms|
    assert ((d_log_gamma.cpu().double() - expected).abs() <= 1e-6 * scale).all()


def test_custom_op_registration():
    from linrnn.kernels.fused import add_rms_norm_op, gated_rms_norm_op, l2_normalize_op, rms_norm_op, swiglu_op

    for op, args in [(rms_norm_op, (leaf(3, 16), leaf(16), 1e-6, torch.float32)),
                     (add_rms_norm_op, (leaf(3, 16), leaf(3, 16), leaf(16), 1e-6, torch.float32))]:  # fmt: skip
        results = torch.library.opcheck(op, args)
        assert set(results.values()) == {"SUCCESS"}, results

    results = torch.library.opcheck(l2_normalize_op, (leaf(2, 5, 2, 8), 1e-6, torch.float32))
    assert set(results.values()) == {"SUCCESS"}, results

    torch.manual_seed(4)
    for gate in ("silu", "sigmoid"):
        results = torch.library.opcheck(gated_rms_norm_op, (leaf(2, 5, 2, 8), leaf(2, 5, 2, 8), leaf(8), 1e-6, gate))
        assert set(results.values()) == {"SUCCESS"}, results
    results = torch.library.opcheck(swiglu_op, (leaf(4, 18),))
    assert set(results.values()) == {"SUCCESS"}, results
