"""The shared math: one generalized recurrence (reference loop, chunked torch) behind ``ops``."""

import functools

import torch
from torch import Tensor

TRITON_CHUNK = 64  # the chunk length (tokens) of the Triton chunkwise kernels


def to_device(x: Tensor, device: torch.device) -> Tensor:
    """``x`` on ``device``; a CPU tensor goes through pinned memory without blocking, so the host does not wait
    for the GPU to finish its queued work (a pageable copy would)."""
    if x.device == device:
        return x
    if device.type == "cuda" and x.device.type == "cpu":
        return x.pin_memory().to(device, non_blocking=True)
    return x.to(device)


def use_triton(x: Tensor, backend: str) -> bool:
    """Whether a fused op runs its Triton kernel for input ``x`` under a mixer's ``backend``: always for "triton",
    for "auto" on CUDA except fp64 (the kernels compute in fp32), never for "torch" or "reference"."""
    return backend == "triton" or backend == "auto" and x.is_cuda and x.dtype != torch.float64


def heads_dense(x: Tensor) -> Tensor:
    """x ``[B, T, H, D]`` as the row kernels read it: heads and channels dense, tokens at one stride (``x.stride(1)``;
    a column slice of a wider ``[B, T, C]`` matrix is read in place); anything else is copied."""
    batch, steps, heads, dim = x.shape
    if steps == 1 and batch > 1 and x.stride(3) == 1 and x.stride(2) == dim:
        # one token a row (decoding): the rows' stride is the tokens' (a size-1 dim's stride can be anything)
        return x.as_strided(x.shape, (x.stride(0), x.stride(0), dim, 1))
    dense = x.stride(3) == 1 and x.stride(2) == dim and (batch == 1 or x.stride(0) == steps * x.stride(1))
    return x if dense else x.contiguous()


def rows_at_one_stride(x: Tensor) -> bool:
    """Whether x's rows (every dim but the last) fold into one dim at one stride, with unit columns: a column slice
    of a wider contiguous matrix does."""
    if x.stride(-1) != 1:
        return False
    try:
        x.view(-1, x.shape[-1])
    except RuntimeError:  # rows at more than one stride
        return False
    return True


def eager(fn):
    """``fn`` run outside torch.compile's graphs (work whose shapes depend on the data, collectives with a custom
    backward). ``torch.compiler.disable`` is applied at the first call: applying it imports torch's compiler (about a
    second), and with it Triton, which ``import linrnn`` does not."""
    disabled = None

    @functools.wraps(fn)
    def run(*args, **kwargs):
        nonlocal disabled
        if disabled is None:
            disabled = torch.compiler.disable(fn)
        return disabled(*args, **kwargs)

    return run
