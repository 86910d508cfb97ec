"""Compiles every Triton kernel linrnn launches for a Hopper GPU (sm_90, through ptxas to a cubin), on a machine
without a GPU: the check to run before spending device time.

The Triton interpreter (the CPU tests) executes kernels line by line and never compiles them, so it misses what
only the compiler sees: a branch that is dead for some constexpr but still compiled (an argument that is None
there), a type the frontend rejects, a shape the layout passes refuse. This script drives linrnn's ops, models
and decoding engine on small CPU tensors with a stand-in driver that reports an sm_90 target, and turns every
kernel launch into a compile only (``JITFunction.run(..., warmup=True)``): nothing runs, the outputs are left
unwritten, and every launch configuration the paths reach is compiled by the real Triton toolchain (its bundled
ptxas). Run it with the Triton to check (the GPU machine has 3.6) and without ``TRITON_INTERPRET``::

    PYTHONPATH=. .venv-triton-3.6.0/bin/python tools/compile_sm90.py [--quick]

A kernel that compiles but needs more shared memory than an sm_90 block has counts as failed (on the GPU it
fails at load time). Prints one line per compiled kernel configuration that failed, a count of those that
compiled, and exits 1 on a failure. Uses a fresh Triton cache (``TRITON_CACHE_DIR`` set to a temporary folder)
unless ``--cache`` is given.
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("compile_sm90.py: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime import driver  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
# the most shared memory one block of an H100 or H200 may use (227 KB): a kernel above it compiles, then fails at
# load time on the GPU (OutOfResources)
MAX_SHARED_BYTES = 232448
TRITON = {"backend": "triton"}  # on CPU tensors "auto" would take the torch path


class CompileOnlyDriver:
    """The few driver calls ``JITFunction.run`` makes before compiling, answered for an sm_90 device."""

    def get_current_target(self):
        return TARGET

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def set_current_device(self, device):
        pass

    def get_active_torch_device(self):
        return torch.device("cpu")

    def get_device_interface(self):
        return torch.cuda


compiled: collections.Counter = collections.Counter()
failures: dict[str, str] = {}
_launch = JITFunction.run


def compile_only(self, *args, grid, warmup, **kwargs):
    """``JITFunction.run`` that compiles and never launches; a compile error is recorded, not raised, so the
    caller's other kernels are still reached."""
    name = self.fn.__name__
    try:
        kernel = _launch(self, *args, grid=grid, warmup=True, **kwargs)
        compiled[name] += 1
        shared = kernel.metadata.shared
        if shared > MAX_SHARED_BYTES:
            stages, warps = kwargs.get("num_stages"), kwargs.get("num_warps")
            failures.setdefault(name, f"needs {shared} bytes of shared memory (num_stages={stages}, num_warps="
                                      f"{warps}); sm_90 allows {MAX_SHARED_BYTES}")  # fmt: skip
    except Exception as error:  # noqa: BLE001 - any compiler error is the finding
        lines = [line for line in str(error).splitlines() if line.strip()]
        failures.setdefault(name, f"{type(error).__name__}: {' | '.join(lines[-3:])}"[:600])


def chunk_cases(quick: bool):
    """(label, thunk) for the chunkwise ops of every cell: autograd forward + backward (the kept-states path),
    varlen with per-sequence initial states, a no-grad forward, fp32 and bf16 inputs, the 340M head shape and an
    odd one."""
    from linrnn.kernels.triton import chunk
    from tests.helpers import CELLS, OPS, forward_backward, make_inputs

    dims = [(128, 64)] if quick else [(128, 256), (100, 100), (64, 64)]
    dtypes = [torch.bfloat16] if quick else [torch.bfloat16, torch.float32]
    # quick: the models' launches, plus the per-channel cells at K = 128, where the backward's 64-wide key blocks are
    # narrower than the whole key (a tile shape only there: a [BT, 128] and a [BT, 64] value under one name failed)
    for cell in ["kda", "gammanet", "gdn2"] if quick else CELLS:
        for k, v in dims:
            for dtype in dtypes:
                fixed = make_inputs(cell, B=2, T=128, H=2, K=k, V=v, dtype=dtype, initial_state=True)
                varlen = make_inputs(cell, B=1, T=100, H=2, K=k, V=v, dtype=dtype, initial_state=True, num_states=3)
                bounds = torch.tensor([0, 37, 64, 100])
                yield f"{cell} K={k} V={v} {dtype} fixed", lambda c=cell, x=fixed: forward_backward(c, x, **TRITON)
                yield (f"{cell} K={k} V={v} {dtype} varlen",
                       lambda c=cell, x=varlen, cu=bounds: forward_backward(c, x, cu_seqlens=cu, **TRITON))  # fmt: skip

                def no_grad(c=cell, x=fixed):
                    with torch.no_grad():
                        OPS[c](**x, output_final_state=True, **TRITON)

                yield f"{cell} K={k} V={v} {dtype} no grad", no_grad

    def local_first(k=32 if quick else 128, v=32 if quick else 256):
        before, chunk.STATE_BWD_LOCAL_FIRST = chunk.STATE_BWD_LOCAL_FIRST, True
        try:
            for cell in ("gated_deltanet", "gammanet"):
                inputs = make_inputs(cell, B=2, T=128, H=2, K=k, V=v, dtype=torch.bfloat16)
                forward_backward(cell, inputs, **TRITON)
        finally:
            chunk.STATE_BWD_LOCAL_FIRST = before

    yield "STATE_BWD_LOCAL_FIRST", local_first

    def decoupled_head_decay(k=32 if quick else 128, v=32 if quick else 256):  # no cell's combination
        from linrnn import ops

        inputs = make_inputs("gated_deltanet", B=2, T=128, H=2, K=k, V=v, dtype=torch.bfloat16)
        inputs["e"] = torch.nn.functional.normalize(torch.randn_like(inputs["k"].float()), dim=-1).bfloat16()
        leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
        ops.recurrence(**leaves, **TRITON)[0].double().sum().backward()

    yield "decoupled erase, per-head decay", decoupled_head_decay


def model_cases():
    """A one-layer model of every cell on the Triton backend: loss forward + backward under bf16 autocast (the
    fused norms, SwiGLU, gates, short convolution, GammaNet's fold, the cross-entropy rows), packed documents,
    and the decoding engine (the single-token kernels; fp32 and bf16 states)."""
    import linrnn
    from linrnn.inference import Engine, Sampling
    from tests.helpers import CELLS

    for cell in CELLS:

        def train_step(c=cell):
            torch.manual_seed(0)
            model = linrnn.build_model(c, preset="byte-tiny", num_layers=1, backend="triton")
            tokens = torch.randint(0, model.config.vocab_size, (2, 96))
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.loss(tokens[:, :-1], tokens[:, 1:]).backward()
            positions = torch.cat([torch.arange(40), torch.arange(55)])[None]
            with torch.autocast("cpu", dtype=torch.bfloat16):
                model.loss(tokens[:1, :-1], tokens[:1, 1:], positions=positions).backward()

        def decode(c=cell):
            torch.manual_seed(0)
            model = linrnn.build_model(c, preset="byte-tiny", num_layers=1, backend="triton")
            for state_dtype in Engine.STATE_DTYPES:  # the fused recurrent kernel storing fp32 and bf16 states
                engine = Engine(model, slots=2, cuda_graph=False, state_dtype=state_dtype)
                engine.generate([torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8])], Sampling(max_new_tokens=3))
            engine = Engine(model.bfloat16(), slots=2, cuda_graph=False)  # bf16: the matrix-vector kernel
            engine.generate([torch.tensor([1, 2, 3, 4, 5]), torch.tensor([7, 8])], Sampling(max_new_tokens=3))

        yield f"{cell} model step", train_step
        yield f"{cell} decoding engine", decode
    yield "decoding launch shapes", decoding_shapes


def decoding_shapes():
    """The launch shapes the tiny models do not reach: the matrix-vector kernel's wide and narrow outputs at 1 and 8
    rows, with each fused input at the 340M model's shapes, the greedy step's end, and the fused recurrent kernel's
    shape for many programs."""
    from linrnn.kernels.triton import fused_recurrent
    from linrnn.kernels.triton.gemv import gemv, gemv_gated_rms_normed, gemv_rms_normed, gemv_swiglu
    from linrnn.kernels.triton.greedy import greedy_step

    def bf16(*shape):
        return torch.randn(*shape, dtype=torch.bfloat16)

    for (columns, depth), rows in [((4672, 1024), 1), ((1024, 2816), 1), ((32000, 1024), 8), ((1024, 1536), 8)]:
        gemv(bf16(rows, depth), bf16(columns, depth))
    for rows in (1, 8):
        for delta in (None, bf16(rows, 1024)):
            gemv_rms_normed(bf16(rows, 1024), delta, bf16(1024), 1e-6, bf16(4672, 1024))  # the mixer's projection
        gemv_rms_normed(bf16(rows, 1024), bf16(rows, 1024), bf16(1024), 1e-6, bf16(5632, 1024))  # gate + up
        for sigmoid in (False, True):
            gemv_gated_rms_normed(bf16(rows, 1536), bf16(rows, 1536), bf16(256), 1e-6, sigmoid, bf16(1024, 1536))
        gemv_swiglu(bf16(rows, 5632), bf16(1024, 2816))
    for slots in (1, 256):  # the greedy step's end, over the 340M model's vocabulary
        long = torch.zeros(slots, dtype=torch.long)
        greedy_step(bf16(slots, 32000), long, long, long, long)
    q, k, v = (torch.randn(4, 1, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    many = fused_recurrent.MANY_PROGRAMS
    fused_recurrent.MANY_PROGRAMS = 0
    try:
        for g in (torch.randn(4, 1, 2), torch.randn(4, 1, 2, 128)):
            fused_recurrent.fused_recurrent_fwd(q, k, v, k, g, torch.rand(4, 1, 2), scale=1.0,
                                                initial_state=torch.randn(4, 2, 128, 128),
                                                output_final_state=True)  # fmt: skip
    finally:
        fused_recurrent.MANY_PROGRAMS = many


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the models, the engine, KDA, GammaNet, GDN-2 at K = 128 "
                        "and STATE_BWD_LOCAL_FIRST only (every kernel, a few shapes, about 3 minutes; CI)")  # fmt: skip
    parser.add_argument("--cache", action="store_true", help="keep the current Triton cache (default: a fresh one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="linrnn-sm90-") as cache:
        if not args.cache:
            os.environ["TRITON_CACHE_DIR"] = cache
        return check(args.quick)


def check(quick: bool) -> int:
    driver.set_active(CompileOnlyDriver())
    JITFunction.run = compile_only
    from linrnn.kernels import ops

    ops._triton_problem = lambda *args: None  # the kernels are compiled, not run: CPU tensors stand in
    start = time.time()
    errors = {}
    for label, case in [*chunk_cases(quick), *model_cases()]:
        before = len(failures)
        try:
            case()
        except Exception as error:  # noqa: BLE001 - a host-side failure around the launches
            errors[label] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:300]
        status = "FAIL" if label in errors or len(failures) > before else "ok"
        print(f"{status:4} {label} ({time.time() - start:.0f} s)", flush=True)
    for name, message in sorted(failures.items()):
        print(f"FAIL kernel {name}: {message}")
    for label, message in errors.items():
        print(f"FAIL case {label}: {message}")
    total = sum(compiled.values())
    print(f"{total} launches compiled for sm_90 ({len(compiled)} kernels) with triton {triton.__version__} in "
          f"{time.time() - start:.0f} s; {len(failures)} kernels failed, {len(errors)} cases failed")  # fmt: skip
    return 1 if failures or errors else 0


if __name__ == "__main__":
    sys.exit(main())
