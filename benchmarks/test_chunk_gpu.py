"""Chunkwise training kernels: linrnn's ops vs FLA 0.6.0's chunk ops vs causal SDPA, forward and forward+backward.

Run on the GPU machine (FLA carried as a wheel; ``bash experiments/gpu_chunk.sh bench`` does all of this)::

    python -m pytest benchmarks/test_chunk_gpu.py --benchmark-only --benchmark-json=chunk.json
    python benchmarks/report.py chunk.json

Per cell and shape B×T ∈ {8×4096, 2×16384}, H = 16, K = V = 128 (``CHUNK_BENCH_HEADS``, ``CHUNK_BENCH_DIM``,
``CHUNK_BENCH_VALUE_DIM``; the 340M models: 6, 128, 256): bf16 q, k, v (and a), fp32 gates
(g = logsigmoid(N(0,1) + 3), beta = sigmoid(U(0,1)), log_gamma = 0.1 N(0,1)), k and a L2-normalised.
Every input requires grad. "fwd" times the forward of a training step (autograd on, so whatever the
op saves for backward is made); "fwdbwd" adds the backward of ``(o * do).sum()`` for a fixed random ``do``
(``torch.autograd.grad(o, inputs, do)``). Times are host medians with ``torch.cuda.synchronize()`` inside the
timed call, after an untimed first call (compile, autotune) and warm-up rounds.
``extra_info["peak_mib"]``: peak allocated memory of one call above what was allocated before it.

FLA (``FLA_DISABLE_BACKEND_DISPATCH=1``): GLA → ``chunk_gla``, DeltaNet → ``chunk_delta_rule``,
GDN → ``chunk_gated_delta_rule``, KDA → ``chunk_kda``, GammaNet → ``chunk_dplr_delta_rule`` with GammaNet-shaped
inputs (rank-one erase along a, ``a = −β a``, ``b = a``; write ``k vᵀ``; per-channel decay), as in
test_decode_gpu.py. Inputs go in pre-normalised with FLA's in-kernel norms and gate/beta activations off.
FLA 0.6.0 refuses its gated backward on Hopper with triton < 3.7.1 (its issue #640); this module lifts that
guard (``fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1 = True``) for speed only and records
``fla_bwd_guard_lifted`` in extra_info: never use FLA's gradients from such a run as a reference.

Dry run on a CPU (torch backend, no FLA, tiny sizes), through environment variables::

    CHUNK_BENCH_DEVICE=cpu CHUNK_BENCH_BACKEND=torch CHUNK_BENCH_SHAPES=2x64 CHUNK_BENCH_HEADS=2 \\
    CHUNK_BENCH_DIM=16 python -m pytest benchmarks/test_chunk_gpu.py --benchmark-only

``CHUNK_BENCH_DEADLINE`` (epoch seconds) skips the tests that would start after it, so that a run cut short by
cold autotuning still writes its JSON (pytest-benchmark writes none when a benchmark is interrupted).
"""

import functools
import os
import time

import pytest
import torch
import torch.nn.functional as F

from tests.helpers import CELLS, OPS

BACKEND = os.environ.get("CHUNK_BENCH_BACKEND", "triton")  # linrnn's backend under test
DEVICE = os.environ.get("CHUNK_BENCH_DEVICE", "cuda")
SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("CHUNK_BENCH_SHAPES", "8x4096,2x16384").split(",")]
H = int(os.environ.get("CHUNK_BENCH_HEADS", "16"))
D = int(os.environ.get("CHUNK_BENCH_DIM", "128"))  # K (and V unless CHUNK_BENCH_VALUE_DIM)
DV = int(os.environ.get("CHUNK_BENCH_VALUE_DIM", str(D)))  # V (the 340M models: H = 6, K = 128, V = 256)
MODES = ["fwd", "fwdbwd"]
DEADLINE = float(os.environ.get("CHUNK_BENCH_DEADLINE", "inf"))  # epoch seconds: later tests skip (cold autotuning)
ON_CUDA = DEVICE == "cuda"

if ON_CUDA and not torch.cuda.is_available():
    pytest.skip("needs CUDA (or CHUNK_BENCH_DEVICE=cpu for a dry run)", allow_module_level=True)

fla_ops, FLA_GUARD_LIFTED, FLA_MISSING = None, False, "FLA runs only on CUDA"
if ON_CUDA:
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # FLA times its own Triton kernels
    try:
        import fla.ops.common.chunk_o as fla_chunk_o
        from fla.ops.delta_rule import chunk_delta_rule
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
        from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule
        from fla.ops.gla import chunk_gla
        from fla.ops.kda import chunk_kda
    except ImportError as error:
        FLA_MISSING = f"cannot import FLA: {error}"
    else:
        fla_ops = {"gla": chunk_gla, "deltanet": chunk_delta_rule, "gated_deltanet": chunk_gated_delta_rule}
        fla_ops.update(kda=chunk_kda, gammanet=chunk_dplr_delta_rule)
        FLA_GUARD_LIFTED = hasattr(fla_chunk_o, "TRITON_ABOVE_3_7_1") and not fla_chunk_o.TRITON_ABOVE_3_7_1
        if FLA_GUARD_LIFTED:  # speed only: FLA's gated gradients are not trusted on this machine
            fla_chunk_o.TRITON_ABOVE_3_7_1 = True


@functools.cache
def inputs(cell, batch, steps):
    """Leaves (requiring grad) for both implementations, and ``do``; built once per (cell, shape)."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=DEVICE)

    x = dict(
        q=randn(batch, steps, H, D).bfloat16(),
        k=F.normalize(randn(batch, steps, H, D), dim=-1).bfloat16(),
        v=randn(batch, steps, H, DV).bfloat16(),
    )
    if cell == "gammanet":
        x["a"] = F.normalize(randn(batch, steps, H, D), dim=-1).bfloat16()
    if cell in ("gla", "kda", "gammanet"):
        x["g"] = F.logsigmoid(randn(batch, steps, H, D) + 3)
    if cell == "gated_deltanet":
        x["g"] = F.logsigmoid(randn(batch, steps, H) + 3)
    if cell != "gla":
        x["beta"] = torch.rand(batch, steps, H, generator=gen, device=DEVICE).sigmoid()
    if cell == "gammanet":
        x["log_gamma"] = 0.1 * randn(H, D)
    fla_x = dict(x)
    if cell == "gammanet":  # GammaNet-shaped DPLR: erase -beta a along a, write k vᵀ, per-channel decay
        erase = -(x["beta"][..., None] * x["a"].float()).bfloat16()
        fla_x = dict(q=x["q"], k=x["k"], v=x["v"], a=erase, b=x["a"].clone(), gk=x["g"])
    for t in [*x.values(), *fla_x.values()]:
        t.requires_grad_(True)
    return x, fla_x, randn(batch, steps, H, DV).bfloat16()


def linrnn_forward(cell, x):
    return OPS[cell](**x, backend=BACKEND)[0]


def fla_forward(cell, x):
    if cell == "gla":
        return chunk_gla(**x)[0]
    if cell == "gammanet":
        return chunk_dplr_delta_rule(**x)[0]
    no_norm = dict(use_qk_l2norm_in_kernel=False)
    if cell == "kda":  # g is already the log-decay, beta already in [0, 1]
        no_norm.update(use_gate_in_kernel=False, use_beta_sigmoid_in_kernel=False)
    return fla_ops[cell](**x, **no_norm)[0]


def sync():
    if ON_CUDA:
        torch.cuda.synchronize()


def time_it(benchmark, fn, rounds=20, warmup_rounds=3):
    """One untimed call (compile, autotune), one measured for peak memory, then the timed rounds."""

    def call():
        fn()
        sync()

    call()
    peak = None
    if ON_CUDA:
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        call()
        peak = (torch.cuda.max_memory_allocated() - before) / 2**20
    benchmark.extra_info["peak_mib"] = peak
    benchmark.pedantic(call, rounds=rounds, warmup_rounds=warmup_rounds)


def describe(benchmark, cell, impl, mode, shape):
    batch, steps = shape
    benchmark.group = f"{cell} {batch}x{steps} {mode}"
    info = dict(kind="chunk", cell=cell, impl=impl, mode=mode, shape=f"{batch}x{steps}", batch=batch, steps=steps)
    benchmark.extra_info.update(info, H=H, K=D, V=DV, dtype="bfloat16")


def step_fn(forward, leaves, do, mode):
    if mode == "fwd":
        return forward
    return lambda: torch.autograd.grad(forward(), leaves, do)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_sdpa(benchmark, shape, mode):
    """Causal softmax attention at the same shapes, [B, H, T, D] bf16: the quadratic baseline (runs first: no
    autotuning)."""
    if time.time() > DEADLINE:
        pytest.skip("past CHUNK_BENCH_DEADLINE")
    batch, steps = shape
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    q, k, v, do = (torch.randn(batch, H, steps, D, generator=gen, device=DEVICE).bfloat16() for _ in range(4))
    leaves = tuple(t.requires_grad_(True) for t in (q, k, v))

    def forward():
        return F.scaled_dot_product_attention(*leaves, is_causal=True)

    describe(benchmark, "sdpa", "sdpa", mode, shape)
    time_it(benchmark, step_fn(forward, leaves, do, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("impl", ["linrnn", "fla"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_chunk(benchmark, shape, cell, impl, mode):
    if impl == "fla" and fla_ops is None:
        pytest.skip(FLA_MISSING)
    if time.time() > DEADLINE:
        pytest.skip("past CHUNK_BENCH_DEADLINE")
    batch, steps = shape
    x, fla_x, do = inputs(cell, batch, steps)
    describe(benchmark, cell, impl, mode, shape)
    if impl == "linrnn":
        args, forward = x, functools.partial(linrnn_forward, cell, x)
        benchmark.extra_info["backend"] = BACKEND
    else:
        args, forward = fla_x, functools.partial(fla_forward, cell, fla_x)
        benchmark.extra_info["fla_bwd_guard_lifted"] = FLA_GUARD_LIFTED
    time_it(benchmark, step_fn(forward, tuple(args.values()), do, mode))
