"""The causal short convolution with SiLU: linrnn's Triton kernels vs FLA 0.6.0's ``causal_conv1d`` (Triton backend),
forward and forward+backward, equal-length rows and packed documents.

Run on the GPU machine (FLA carried as a wheel)::

    python -m pytest benchmarks/test_short_conv_gpu.py --benchmark-only --benchmark-json=short_conv.json
    python benchmarks/report.py short_conv.json

Shapes: the 340M GDN mixer's convolved channels (q, k, v: 768 + 768 + 1536 = 3072 columns, ``SHORT_CONV_CHANNELS``)
at 4×4096 and 1×16384 tokens (``SHORT_CONV_SHAPES``), W = 4, bf16 x, fp32 weight, both implementations on the same
contiguous x. "packed": the same tokens as one row of documents of lengths 1 … 2048 (a fixed draw), linrnn
through ``offset`` (each token's index in its document), FLA through ``cu_seqlens``. "fwdbwd" adds the gradients of
x and the weight for a fixed random ``dy``. Host medians with a device sync inside the timed call, after an
untimed first call (compile) and warm-up rounds; ``extra_info["peak_mib"]``: peak allocated memory of one call
above what was allocated before it.
"""

import functools
import os

import pytest
import torch

DEVICE = "cuda"
SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("SHORT_CONV_SHAPES", "4x4096,1x16384").split(",")]
CHANNELS = int(os.environ.get("SHORT_CONV_CHANNELS", "3072"))
WIDTH = 4

if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from linrnn.kernels.short_conv import short_conv  # noqa: E402

try:
    from fla.modules.causal_conv1d.ops import causal_conv1d
except ImportError as error:
    causal_conv1d, FLA_MISSING = None, f"cannot import FLA: {error}"


@functools.cache
def inputs(batch: int, steps: int, packed: bool):
    """x [B, T, C] bf16, weight [C, 1, W] fp32 (FLA reads it as [C, W]), dy, and for packed documents (one row)
    linrnn's offset [T] and FLA's cu_seqlens [D + 1]."""
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    rows, tokens = (1, batch * steps) if packed else (batch, steps)
    x = torch.randn(rows, tokens, CHANNELS, generator=gen, device=DEVICE).bfloat16().requires_grad_(True)
    weight = (0.5 * torch.randn(CHANNELS, 1, WIDTH, generator=gen, device=DEVICE)).requires_grad_(True)
    dy = torch.randn(rows, tokens, CHANNELS, generator=gen, device=DEVICE).bfloat16()
    offset = cu_seqlens = None
    if packed:
        lengths, total = [], 0
        draw = torch.Generator().manual_seed(1)
        while total < tokens:
            length = min(int(torch.randint(1, 2049, (1,), generator=draw)), tokens - total)
            lengths.append(length)
            total += length
        offset = torch.cat([torch.arange(n) for n in lengths]).to(DEVICE)
        cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE, dtype=torch.int32)
    return x, weight, dy, offset, cu_seqlens


def linrnn_forward(x, weight, offset, cu_seqlens):
    return short_conv(x, weight, None, offset, backend="triton")


def fla_forward(x, weight, offset, cu_seqlens):
    return causal_conv1d(x, weight.squeeze(1), activation="silu", backend="triton", cu_seqlens=cu_seqlens)[0]


@pytest.mark.parametrize("mode", ["fwd", "fwdbwd"])
@pytest.mark.parametrize("impl", ["linrnn", "fla"])
@pytest.mark.parametrize("packed", [False, True], ids=["rows", "packed"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_short_conv(benchmark, shape, packed, impl, mode):
    if impl == "fla" and causal_conv1d is None:
        pytest.skip(FLA_MISSING)
    batch, steps = shape
    x, weight, dy, offset, cu_seqlens = inputs(batch, steps, packed)
    forward = functools.partial(linrnn_forward if impl == "linrnn" else fla_forward, x, weight, offset, cu_seqlens)

    def call():
        if mode == "fwd":
            forward()
        else:
            torch.autograd.grad(forward(), (x, weight), dy)
        torch.cuda.synchronize()

    call()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    call()
    benchmark.group = f"short_conv {batch}x{steps} {'packed' if packed else 'rows'} {mode}"
    benchmark.extra_info.update(
        kind="short_conv", impl=impl, mode=mode, batch=batch, steps=steps, packed=packed, channels=CHANNELS,
        width=WIDTH, peak_mib=(torch.cuda.max_memory_allocated() - before) / 2**20,
        documents=None if cu_seqlens is None else cu_seqlens.numel() - 1, device=torch.cuda.get_device_name(),
    )  # fmt: skip
    benchmark.pedantic(call, rounds=30, warmup_rounds=5)
