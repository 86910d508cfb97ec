"""GPU decode step: one token with a carried state, linrnn's fused recurrent kernel vs FLA 0.6.0's, same run.

Run on the GPU machine (FLA carried as a wheel, see experiments/gpu_bench.sh):
``python -m pytest benchmarks/test_decode_gpu.py --benchmark-only --benchmark-json=decode.json``
then ``python benchmarks/report.py decode.json`` for the table in RESULTS.md.
"""

import os

import pytest
import torch
import torch.nn.functional as F

from linrnn import ops

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)
os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # FLA times its own Triton kernels
fla = pytest.importorskip("fla")
from fla.ops.delta_rule import fused_recurrent_delta_rule  # noqa: E402
from fla.ops.gated_delta_rule import fused_recurrent_gated_delta_rule  # noqa: E402
from fla.ops.generalized_delta_rule import fused_recurrent_dplr_delta_rule  # noqa: E402
from fla.ops.gla import fused_recurrent_gla  # noqa: E402
from fla.ops.kda import fused_recurrent_kda  # noqa: E402

H, K, V = 16, 128, 128


def decode_inputs(batch):
    """One bf16 token per sequence, gates in fp32, a random fp32 state."""
    gen = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device="cuda")

    return dict(
        q=randn(batch, 1, H, K).bfloat16(),
        k=F.normalize(randn(batch, 1, H, K), dim=-1).bfloat16(),
        v=randn(batch, 1, H, V).bfloat16(),
        a=F.normalize(randn(batch, 1, H, K), dim=-1).bfloat16(),
        g_head=F.logsigmoid(randn(batch, 1, H) + 3),
        g_chan=F.logsigmoid(randn(batch, 1, H, K) + 3),
        beta=torch.rand(batch, 1, H, generator=gen, device="cuda"),
        log_gamma=0.1 * randn(H, K),
        state=randn(batch, H, K, V),
    )


def linrnn_step(cell, x, backend):
    common = dict(initial_state=x["state"], output_final_state=True, backend=backend)
    q, k, v = x["q"], x["k"], x["v"]
    if cell == "gla":
        return ops.gla(q, k, v, x["g_chan"], **common)
    if cell == "deltanet":
        return ops.delta_rule(q, k, v, x["beta"], **common)
    if cell == "gated_deltanet":
        return ops.gated_delta_rule(q, k, v, x["g_head"], x["beta"], **common)
    if cell == "kda":
        return ops.kda(q, k, v, x["g_chan"], x["beta"], **common)
    return ops.gammanet(q, k, v, x["a"], x["g_chan"], x["beta"], x["log_gamma"], **common)


def fla_step(cell, x):
    common = dict(initial_state=x["state"], output_final_state=True)
    q, k, v = x["q"], x["k"], x["v"]
    if cell == "gla":
        return fused_recurrent_gla(q, k, v, gk=x["g_chan"], **common)
    if cell == "deltanet":
        return fused_recurrent_delta_rule(q, k, v, beta=x["beta"], **common)
    if cell == "gated_deltanet":
        return fused_recurrent_gated_delta_rule(q, k, v, g=x["g_head"], beta=x["beta"], **common)
    if cell == "kda":
        return fused_recurrent_kda(q, k, v, g=x["g_chan"], beta=x["beta"], **common)
    # GammaNet-shaped DPLR step: erase along a (rank one), write k vᵀ, per-channel decay
    erase = -(x["beta"][..., None] * x["a"].float()).bfloat16()
    return fused_recurrent_dplr_delta_rule(q, k, v, a=erase, b=x["a"], gk=x["g_chan"], **common)


@pytest.mark.parametrize("batch", [1, 64])
@pytest.mark.parametrize("impl", ["linrnn", "linrnn_torch", "fla"])
@pytest.mark.parametrize("cell", ["gla", "deltanet", "gated_deltanet", "kda", "gammanet"])
def test_decode_step(benchmark, cell, impl, batch):
    x = decode_inputs(batch)

    def step():
        with torch.no_grad():
            if impl == "fla":
                fla_step(cell, x)
            else:
                linrnn_step(cell, x, "auto" if impl == "linrnn" else "torch")
        torch.cuda.synchronize()

    benchmark.group = f"{cell} B={batch}"
    benchmark.extra_info.update(cell=cell, impl=impl, batch=batch, H=H, K=K, V=V, dtype="bfloat16")
    benchmark.pedantic(step, rounds=200, warmup_rounds=20)


@pytest.mark.parametrize("steps", [64, 256, 2048])
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("cell", ["gated_deltanet", "kda"])
def test_prefill_no_grad(benchmark, cell, backend, steps):
    """Inference on a prompt: backend "triton" (fused recurrent up to 64 steps, chunkwise beyond) against torch."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch = 8
    q, k = (F.normalize(torch.randn(batch, steps, H, K, generator=gen, device="cuda"), dim=-1).bfloat16() for _ in "qk")
    v = torch.randn(batch, steps, H, V, generator=gen, device="cuda").bfloat16()
    g_shape = (batch, steps, H, K) if cell == "kda" else (batch, steps, H)
    g = F.logsigmoid(torch.randn(*g_shape, generator=gen, device="cuda") + 3)
    beta = torch.rand(batch, steps, H, generator=gen, device="cuda")
    op = ops.kda if cell == "kda" else ops.gated_delta_rule

    def run():
        with torch.no_grad():
            op(q, k, v, g, beta, output_final_state=True, backend=backend)
        torch.cuda.synchronize()

    benchmark.group = f"prefill {cell} B={batch} T={steps}"
    benchmark.extra_info.update(cell=cell, impl=backend, batch=batch, steps=steps, kind="prefill")
    benchmark.pedantic(run, rounds=20, warmup_rounds=3)
