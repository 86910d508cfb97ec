"""A chunkwise backend against the fp64 reference: outputs, final states and every gradient, for every cell.

On the GPU machine, one device call (carry ``.whl``, and ``.triton_cache.tgz`` from an earlier call if any)::

    bash experiments/gpu_chunk.sh check                  # or just:
    python3 experiments/check_triton_chunk.py            # --backend triton --device cuda

No case starts after ``--max-seconds`` (default 420; gpu_chunk.sh passes what its budget leaves). The small
cases run in one process per (cell, dtype) (``--jobs``), so that Triton compiles their kernels in parallel on
the host's cores; the large ones run afterwards, one at a time (the fp64 reference of T = 4096, H = 16, K = V =
128 keeps ~25 GiB for its backward).

CPU dry run of the harness with the torch backend (tiny sizes)::

    python experiments/check_triton_chunk.py --backend torch --device cpu --quick

Each case runs ``linrnn.ops.<cell>(..., backend=<--backend>)`` in bf16 (q, k, v, a) or fp32, with fp32 gates,
log_gamma and initial state (inputs from tests.helpers.make_inputs: unit k and a, g = logsigmoid(N(0,1) + 2),
beta ~ U(0, 2)), and the same op with ``backend="reference"`` (the sequential loop) on the same
values in fp64 on the same device. Loss ``<o, do> + <S_T, dS>`` (do rounded to o's dtype, so both runs see
the same cotangent); compared: o, the final state and the gradient of every input (q, k, v, g, beta, a, b,
log_gamma, initial_state as the cell has them), each by ``‖actual − ref‖ / ‖ref‖`` against 1e-2 (bf16) or
1e-4 (fp32); anything non-finite fails. Unwritten outputs show up as NaN: with the Triton backend every buffer
from ``linrnn.kernels.triton.chunk.new_output`` starts as NaN, and on CUDA the caching allocator is filled with
NaN and released before each run (best effort for other allocations).

Cases vary one axis at a time around a base (T = 65, K = V = 64, H = 4, B = 2, with initial state):
T ∈ {1, 63, 64, 1000}, K = V ∈ {100, 128, 256}, H ∈ {1, 16}, no initial state, varlen (B = 1, uneven
cu_seqlens, with and without initial states), extreme gates (log-decay −20 on some steps and channels,
beta exactly 0 and 1 on some steps), then two large cases (T = 4096, K = V = 128, H = 16, B = 1; T = 1000,
K = V = 256, H = 4, B = 2). ``--quick`` uses T ∈ {1, 5, 17}, K = V ∈ {8, 12}, H ∈ {1, 2}.

``--only small`` or ``--only large`` splits the check over two device calls.

Prints one line per case and a summary. Exit code 1 if any case failed, 2 if none failed but some were not
run because ``--max-seconds`` ran out (the large cases come last).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import subprocess
import sys
import time
import zlib
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: linrnn and tests.helpers

from tests.helpers import CELLS, OPS, make_inputs  # noqa: E402

THRESHOLDS = {torch.bfloat16: 1e-2, torch.float32: 1e-4}
DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
LOW_PRECISION = ("q", "k", "v", "a")  # cast to the case's dtype; gates, log_gamma and states stay fp32


@dataclasses.dataclass(frozen=True)
class Case:
    name: str
    T: int
    D: int  # K = V
    H: int
    B: int = 2
    initial_state: bool = True
    lengths: tuple[int, ...] | None = None  # varlen: B = 1, T = sum(lengths)
    extreme: bool = False


def cases(quick: bool) -> tuple[list[Case], list[Case]]:
    """Small cases (one axis at a time around the base), and the large ones."""
    if quick:
        base, extreme_steps = Case("base", 5, 8, 2), 17
        steps, dims, heads, lengths = (1, 17), (12,), (1,), (1, 5, 17)
        large = [Case("large T=17 K=V=12", 17, 12, 2, B=1)]
    else:
        base, extreme_steps = Case("base", 65, 64, 4), 200
        steps, dims, heads = (1, 63, 64, 1000), (100, 128, 256), (1, 16)
        lengths = (1, 63, 64, 65, 200)  # uneven: one step, chunk − 1, chunk, chunk + 1, several chunks
        large = [Case("large T=4096 K=V=128 H=16", 4096, 128, 16, B=1), Case("large T=1000 K=V=256", 1000, 256, 4)]
    varlen = dataclasses.replace(base, name="varlen", T=sum(lengths), B=1, lengths=lengths)
    small = [base]
    small += [dataclasses.replace(base, name=f"T={t}", T=t) for t in steps]
    small += [dataclasses.replace(base, name=f"K=V={d}", D=d) for d in dims]
    small += [dataclasses.replace(base, name=f"H={h}", H=h) for h in heads]
    small += [dataclasses.replace(base, name="no initial state", initial_state=False)]
    small += [varlen, dataclasses.replace(varlen, name="varlen, no initial state", initial_state=False)]
    small += [dataclasses.replace(base, name="extreme gates", T=extreme_steps, extreme=True)]
    return small, large


def build(cell: str, case: Case, dtype: torch.dtype, device: str) -> dict[str, torch.Tensor]:
    """The case's inputs as the tested backend sees them (q, k, v, a in ``dtype``, the rest fp32)."""
    seed = zlib.crc32(f"{cell}/{case.name}/{dtype}".encode())
    states = len(case.lengths) if case.lengths else None
    x = make_inputs(
        cell, B=case.B, T=case.T, H=case.H, K=case.D, V=case.D, initial_state=case.initial_state,
        num_states=states, seed=seed,
    )  # fmt: skip
    if case.extreme:
        gen = torch.Generator().manual_seed(seed + 1)
        if "g" in x:  # log-decay −20 on ~15% of (step, channel) entries and on every channel of ~10% of steps
            spot = torch.rand(x["g"].shape, generator=gen) < 0.15
            whole = torch.rand(x["g"].shape[:3], generator=gen) < 0.1
            whole = whole.view(*whole.shape, *[1] * (x["g"].dim() - 3))
            x["g"] = torch.where(spot | whole, -20.0, x["g"])
        if "beta" in x:  # exactly 0 on ~20% of steps, exactly 1 on ~20%
            u = torch.rand(x["beta"].shape, generator=gen)
            x["beta"] = torch.where(u < 0.2, 0.0, torch.where(u > 0.8, 1.0, x["beta"]))
    return {n: t.to(device, dtype if n in LOW_PRECISION else torch.float32) for n, t in x.items()}


def poison_allocator(device: str) -> None:
    """Fills cached CUDA blocks with NaN and frees them, so unwritten outputs read back as NaN."""
    if device.startswith("cuda"):
        torch.cuda.empty_cache()  # what stays cached is then only the poison
        blocks = [torch.full((n,), float("nan"), device=device) for n in [2**17] * 64 + [2**23] * 16]
        del blocks


def poison_triton_outputs() -> None:
    """Buffers from ``linrnn.kernels.triton.chunk.new_output`` (where that hook exists) start as NaN."""
    from linrnn.kernels.triton import chunk

    if hasattr(chunk, "new_output"):
        chunk.new_output = lambda shape, dtype, device: torch.full(shape, float("nan"), dtype=dtype, device=device)


def forward_backward(cell, inputs, cu_seqlens, d_o, d_state, **op_args):
    """Results of ``<o, d_o> + <S_T, d_state>``: o, the final state and the gradient of every input."""
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    o, final = OPS[cell](**leaves, output_final_state=True, cu_seqlens=cu_seqlens, **op_args)
    loss = (o.double() * d_o).sum() + (final.double() * d_state).sum()
    grads = torch.autograd.grad(loss, list(leaves.values()))
    return {"o": o, "final_state": final, **{f"d{name}": g for name, g in zip(leaves, grads, strict=True)}}


def relative_errors(actual: dict, expected: dict) -> dict[str, float]:
    errors = {}
    for name, ref in expected.items():
        got = actual[name]
        if got.shape != ref.shape:
            raise ValueError(f"{name} has shape {list(got.shape)}, expected {list(ref.shape)}")
        if not torch.isfinite(got).all():
            errors[f"{name} (non-finite)"] = float("inf")
            continue
        diff, scale = (got.double() - ref).norm().item(), ref.norm().item()
        errors[name] = diff / scale if scale > 0 else diff
    return errors


def run_case(cell, case, dtype, args) -> tuple[float, str]:
    """Returns (max relative error, worst tensor)."""
    inputs = build(cell, case, dtype, args.device)
    cu_seqlens = None
    if case.lengths:
        cu_seqlens = torch.tensor([0, *torch.tensor(case.lengths).cumsum(0).tolist()], device=args.device)
    gen = torch.Generator().manual_seed(7)
    v_shape = (case.B, case.T, case.H, case.D)
    states = (len(case.lengths) if case.lengths else case.B, case.H, case.D, case.D)
    d_o = torch.randn(v_shape, generator=gen).to(args.device, dtype).double()
    d_state = torch.randn(states, generator=gen).to(args.device, torch.float32).double()
    reference = {name: x.double() for name, x in inputs.items()}
    expected = forward_backward(cell, reference, cu_seqlens, d_o, d_state, backend="reference")
    expected = {name: x.detach().double() for name, x in expected.items()}
    poison_allocator(args.device)
    actual = forward_backward(cell, inputs, cu_seqlens, d_o, d_state, backend=args.backend)
    errors = relative_errors(actual, expected)
    worst = max(errors, key=errors.get)
    return errors[worst], worst


def run_cases(plan, args, deadline):
    """Yields ``(status, line)`` per case of ``plan`` ((cell, dtype, case) triples), status PASS, FAIL or NOT RUN."""
    if args.backend == "triton":
        poison_triton_outputs()
        if args.local_first:
            from linrnn.kernels.triton import chunk

            chunk.STATE_BWD_LOCAL_FIRST = True
    for cell, dtype, case in plan:
        label = f"{cell:<15} {DTYPE_NAMES[dtype]:<5} {case.name:<26}"
        if time.time() > deadline:
            yield "NOT RUN", f"{label} NOT RUN (time budget)"
            continue
        start = time.perf_counter()
        try:
            error, worst = run_case(cell, case, dtype, args)
        except Exception as exc:  # a crash fails this case, not the whole check
            error, worst = float("inf"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
        status = "PASS" if error <= THRESHOLDS[dtype] else "FAIL"
        seconds = time.perf_counter() - start
        yield status, f"{label} max rel err {error:9.2e}  {worst:<14} {status}  {seconds:5.1f}s"


def run_worker(cell, dtype, args, deadline):
    """The small cases of one (cell, dtype) in a child process (this script with ``--worker``); a crash there
    fails that group only. Returns ``(status, line)`` pairs."""
    command = [sys.executable, __file__, "--worker", f"{deadline}", "--backend", args.backend, "--device", args.device]
    command += ["--cells", cell, "--dtypes", DTYPE_NAMES[dtype]] + ["--quick"] * args.quick
    command += ["--cases", *args.cases] if args.cases else []
    command += ["--local-first"] * args.local_first
    child = subprocess.run(command, capture_output=True, text=True)
    results = [tuple(line.split("\t", 1)) for line in child.stdout.splitlines() if "\t" in line]
    missing = len([case for case in cases(args.quick)[0] if not args.cases or case.name in args.cases]) - len(results)
    if child.returncode or missing:
        why = (child.stderr.strip().splitlines() or ["no error output"])[-1][:200]
        line = f"{cell:<15} {DTYPE_NAMES[dtype]:<5} worker exited with {child.returncode}, {missing} cases lost: {why}"
        results += [("FAIL", line)] + [("FAIL", None)] * (missing - 1)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--backend", default="triton", help="backend under test (default triton)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, for a CPU dry run")
    parser.add_argument("--cells", nargs="+", default=CELLS, choices=CELLS)
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPE_NAMES.values()), choices=DTYPE_NAMES.values())
    parser.add_argument("--max-seconds", type=float, default=420.0, help="start no case after this (default 420)")
    parser.add_argument(
        "--jobs", type=int, default=None, help="processes for the small cases, which compile their kernels in "
        "parallel (default: one per (cell, dtype), at most 10, on CUDA; 1 on CPU)"
    )  # fmt: skip
    parser.add_argument(
        "--only", choices=("small", "large"), help="run only the small or only the large cases (to split the check "
        "over two device calls)"
    )  # fmt: skip
    parser.add_argument("--cases", nargs="+", help="run only the cases of these names (e.g. 'varlen' 'extreme gates')")
    parser.add_argument(
        "--local-first", action="store_true", help="with chunk.STATE_BWD_LOCAL_FIRST on (the backward state pass's "
        "chunk-local terms from a parallel kernel first)"
    )  # fmt: skip
    parser.add_argument("--worker", type=float, help=argparse.SUPPRESS)  # run_worker's child: the deadline
    args = parser.parse_args()
    dtypes = [dtype for dtype, name in DTYPE_NAMES.items() if name in args.dtypes]
    small, large = cases(args.quick)
    small, large = ([] if args.only == "large" else small), ([] if args.only == "small" else large)
    if args.cases:
        small, large = ([case for case in group if case.name in args.cases] for group in (small, large))
    if args.worker is not None:
        if args.device == "cpu":
            torch.set_num_threads(1)
        plan = [(cell, dtype, case) for cell in args.cells for dtype in dtypes for case in small]
        for status, line in run_cases(plan, args, args.worker):
            print(f"{status}\t{line}", flush=True)
        return 0
    if args.device.startswith("cuda"):
        print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    start, deadline = time.perf_counter(), time.time() + args.max_seconds
    groups = [(cell, dtype) for cell in args.cells for dtype in dtypes]
    jobs = args.jobs or (min(len(groups), 10) if args.device.startswith("cuda") else 1)
    counts = collections.Counter()

    def show(results):
        for status, line in results:
            counts[status] += 1
            if line:
                print(line, flush=True)

    if jobs > 1 and small:  # Triton compiles on the host, one kernel at a time per process: spread the groups
        with ThreadPoolExecutor(jobs) as pool:
            for done in as_completed([pool.submit(run_worker, cell, dtype, args, deadline) for cell, dtype in groups]):
                show(done.result())
    else:
        show(run_cases([(cell, dtype, case) for cell, dtype in groups for case in small], args, deadline))
    # the large cases one at a time in this process: the fp64 reference keeps ~25 GiB for T = 4096, H = 16
    show(run_cases([(cell, dtype, case) for case in large for cell, dtype in groups], args, deadline))
    total, seconds = sum(counts.values()), time.perf_counter() - start
    print(f"\n{counts['PASS']}/{total} passed, {counts['FAIL']} failed, {counts['NOT RUN']} not run "
          f"(backend {args.backend}, device {args.device}, {jobs} jobs, {seconds:.0f} s)")  # fmt: skip
    return 1 if counts["FAIL"] else 2 if counts["NOT RUN"] else 0


if __name__ == "__main__":
    sys.exit(main())
