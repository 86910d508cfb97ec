"""Kernel launches with Triton's per-call argument binding skipped for a repeated configuration.

``kernel[grid](*args, **kwargs)`` on a ``@triton.jit`` function binds and specializes every argument, computes the
cache key, finds the compiled kernel and launches it: about 30 µs of host time per launch on the H200 machine's host
for a kernel with the chunk kernels' ~30 arguments, against 11 µs for the compiled kernel's launcher called directly
(``experiments/launch_overhead.py``). A forward of the chunk op makes 3–5 launches, a backward 5–8.

``CachedLaunch`` keys each call on a refinement of Triton's specialization: per tensor its dtype and whether its
address is 16-byte aligned (what Triton specializes a pointer on), every other argument by type and value
(integers, floats, flags and constexprs), the launch options and the current device. The first call of a key goes
through Triton (compiling as usual) and keeps the compiled kernel it returns; later calls of the key pass the same
arguments straight to that kernel's launcher on the current stream (so CUDA-graph capture records them as before).
Equal keys mean equal specializations, so the kernel is the one Triton would have picked.

Used only on a CUDA device with a Triton whose launcher calling convention was checked (``TESTED_TRITON``); under
``TRITON_INTERPRET=1``, on other Triton versions or with ``ENABLED = False`` every call goes through Triton.
"""

from __future__ import annotations

import functools
import os

import torch
import triton
from triton import knobs

ENABLED = True
TESTED_TRITON = ("3.6.",)  # versions whose CompiledKernel.run / launch_metadata signatures this module calls
MAX_KEYS = 512  # per kernel; past it the cache starts over (many sequence lengths, e.g. prompts in generation)


@functools.cache
def _supported() -> bool:
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return not interpreted and torch.cuda.is_available() and triton.__version__.startswith(TESTED_TRITON)


def cached_launch(kernel) -> CachedLaunch:
    """Decorator over ``@triton.jit``: the kernel launched through ``CachedLaunch``."""
    return CachedLaunch(kernel)


def argument_key(value) -> tuple:
    """The part of a launch's cache key one argument gives: a tensor's dtype and 16-byte alignment, else the
    argument's type and value."""
    if isinstance(value, torch.Tensor):
        return value.dtype, value.data_ptr() % 16 == 0
    return type(value), value


class CachedLaunch:
    """Wraps a ``@triton.jit`` kernel: ``CachedLaunch(kernel)[grid](*args, **kwargs)`` launches as
    ``kernel[grid](*args, **kwargs)`` does (module docstring)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.names = tuple(getattr(kernel, "arg_names", ()))  # every parameter, constexprs too, in signature order
        self.compiled = {}

    def __getitem__(self, grid):
        return functools.partial(self.launch, grid)

    def launch(self, grid, *args, **kwargs):
        if not (ENABLED and _supported()) or callable(grid) or not set(self.names[len(args) :]) <= kwargs.keys():
            return self.kernel[grid](*args, **kwargs)  # a missing argument: Triton's defaults or its error
        bound = args + tuple(kwargs[name] for name in self.names[len(args) :])
        options = tuple(sorted((name, value) for name, value in kwargs.items() if name not in self.names))
        device = torch.cuda.current_device()
        key = (device, options, *map(argument_key, bound))
        compiled = self.compiled.get(key)
        if compiled is None:
            compiled = self.kernel[grid](*args, **kwargs)
            if hasattr(compiled, "result"):  # compiled asynchronously
                compiled = compiled.result()
            if len(self.compiled) >= MAX_KEYS:
                self.compiled.clear()
            self.compiled[key] = compiled
            return compiled
        grid = (*grid, 1, 1)
        stream = torch._C._cuda_getCurrentRawStream(device)
        metadata = compiled.launch_metadata(grid, stream, *bound)
        compiled.run(grid[0], grid[1], grid[2], stream, compiled.function, compiled.packed_metadata, metadata,
                     knobs.runtime.launch_enter_hook, knobs.runtime.launch_exit_hook, *bound)  # fmt: skip
        return compiled
