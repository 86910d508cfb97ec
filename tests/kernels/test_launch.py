"""``linrnn.kernels.triton.launch``: the launch cache's key, and on a GPU the cached launches against Triton's own."""

import importlib.util

import pytest
import torch
import torch.nn.functional as F

if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from linrnn import ops  # noqa: E402
from linrnn.kernels.triton import launch  # noqa: E402


def test_argument_key_separates_what_triton_specializes_on():
    x = torch.zeros(64, dtype=torch.bfloat16)
    assert launch.argument_key(x) == launch.argument_key(torch.ones(64, dtype=torch.bfloat16)) == (x.dtype, True)
    assert launch.argument_key(x[1:]) == (torch.bfloat16, False)  # 2 bytes past a 16-byte boundary
    assert launch.argument_key(x[8:]) == (torch.bfloat16, True)
    assert launch.argument_key(x.float()) != launch.argument_key(x)
    assert launch.argument_key(16) != launch.argument_key(17)
    assert launch.argument_key(1) != launch.argument_key(True)
    assert launch.argument_key(None) == (type(None), None)


def test_falls_back_to_triton_without_a_gpu(monkeypatch):
    """Without CUDA (or under the interpreter) every call is the kernel's own launch, nothing cached."""
    if launch._supported():
        pytest.skip("a CUDA device with a tested Triton: the cached path is taken")
    calls = []

    class Kernel:
        arg_names = ["x", "N"]

        def __getitem__(self, grid):
            return lambda *args, **kwargs: calls.append((grid, args, kwargs))

    cached = launch.CachedLaunch(Kernel())
    cached[(3,)](torch.zeros(2), N=2, num_warps=4)
    cached[(3,)](torch.zeros(2), N=2, num_warps=4)
    assert len(calls) == 2 and calls[0][0] == (3,) and calls[0][2] == {"N": 2, "num_warps": 4}
    assert cached.compiled == {}


def _gdn_run(v_offset, seed=0):
    """Output and gradients of a GDN chunk op on the GPU, v read from a wider buffer at ``v_offset`` elements."""
    torch.manual_seed(seed)
    B, T, H, K, V = 2, 130, 2, 64, 32
    q = torch.randn(B, T, H, K, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = F.normalize(torch.randn(B, T, H, K, device="cuda"), dim=-1).bfloat16().requires_grad_(True)
    rows = torch.randn(B, T, H * V + 8, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = rows[..., v_offset : v_offset + H * V].view(B, T, H, V)
    g = F.logsigmoid(torch.randn(B, T, H, device="cuda") + 3).requires_grad_(True)
    beta = torch.rand(B, T, H, device="cuda").requires_grad_(True)
    o, _ = ops.gated_delta_rule(q, k, v, g, beta, backend="triton")
    (o.float() * torch.randn_like(o, dtype=torch.float32)).sum().backward()
    return [o.detach(), q.grad, k.grad, rows.grad, g.grad, beta.grad]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the cached launch runs on CUDA only")
@pytest.mark.parametrize("v_offset", [0, 1], ids=["aligned", "misaligned"])
def test_cached_launches_match_triton_launches(v_offset, monkeypatch):
    """Bit for bit the results of Triton's own launches, on the first (compiling) and a repeated (cached) call;
    v 2 bytes off a 16-byte boundary takes its own compiled kernel."""
    monkeypatch.setattr(launch, "ENABLED", False)
    expected = _gdn_run(v_offset)
    monkeypatch.setattr(launch, "ENABLED", True)
    for _ in range(2):
        for actual, want in zip(_gdn_run(v_offset), expected, strict=True):
            assert torch.equal(actual, want)
    from linrnn.kernels.triton import chunk_fwd

    state_pass = chunk_fwd.chunk_state_fwd_kernel
    v_key = 2 + state_pass.names.index("v")  # a key: device, options, then the arguments
    assert launch._supported() and state_pass.compiled, "the state pass never went through the cache"
    assert any(key[v_key] == (torch.bfloat16, v_offset == 0) for key in state_pass.compiled)
