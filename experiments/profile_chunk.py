"""Per-kernel GPU time of the chunkwise ops (forward + backward), from the CUDA profiler, with FLA's optional.

Run on the device with the carried wheels on PYTHONPATH::

    python3 experiments/profile_chunk.py [--cells deltanet gated_deltanet ...] [--fla] [--shape 8x4096]
        [--heads 16 --dim 128 --value-dim 128] [--variants "" "main=4,bv128=64" ...]

The 340M models' recurrence, state-pass settings side by side (issue 24's 1×16384 gap)::

    python3 experiments/profile_chunk.py --cells gated_deltanet --shape 1x16384 --heads 6 --value-dim 256 --fla \
        --variants "" "programs=48" "programs=24" "programs=48,state_bwd=4" "state_stages=3" "local_first=1"

Per cell: the medians of ``triton.testing.do_bench`` and of one call with a synchronisation inside (as the pytest
benchmarks time it: host time counts) for forward and forward+backward, then each profiled over ``--repeats`` calls:
every kernel's mean time per call, sorted, and their sum. ``--fla`` adds FLA 0.6.0's
matching op (cold autotuning: about two minutes per op; its gated backward guard lifted for speed only, see
benchmarks/test_chunk_gpu.py). Inputs: bf16 q, k, v, a; fp32 gates.

``--variants`` compares launch settings side by side, each a comma list of ``kernel=warps`` (keys of
``chunk.WARPS``), ``bv<K>=columns`` (``chunk.STATE_BLOCK_V``), ``programs=n`` (``chunk.STATE_MIN_PROGRAMS``),
``fused_k=n`` (``chunk.FUSED_MAX_K``; 0: never the fused backward), ``fused_bv=n`` (``chunk.FUSED_BLOCK_V``),
``state_stages=n`` and ``stages=n`` (``chunk.STAGES_16BIT`` up to K = 128), ``stages_<kernel>=n``
(``chunk.KERNEL_STAGES_16BIT``, kernels named as in ``chunk.WARPS``), ``solve_wu_block=n``
(``chunk.SOLVE_WU_BLOCK``), ``solve_kk_block=n`` (``chunk.SOLVE_KK_BLOCK``), ``local_first=1``
(``chunk.STATE_BWD_LOCAL_FIRST``), ``cached_launch=0`` (``launch.ENABLED``), ``keep_states=0``
(``library.KEEP_STATES``);
"" is the defaults.
"""

import argparse
import collections
import copy
import functools
import os
import statistics
import time

import torch
import torch.nn.functional as F
import triton
from torch.profiler import ProfilerActivity, profile, record_function

from linrnn import ops
from linrnn.kernels import library
from linrnn.kernels.triton import chunk

try:
    from linrnn.kernels.triton import launch
except ImportError:  # an older tree
    launch = None

CELLS = ["gla", "deltanet", "gated_deltanet", "kda", "gammanet"]


def make_inputs(batch, steps, heads, dim, value_dim=None):
    torch.manual_seed(0)
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    value_dim = value_dim or dim
    x = dict(
        q=torch.randn(batch, steps, heads, dim, **bf16),
        k=F.normalize(torch.randn(batch, steps, heads, dim, device="cuda"), dim=-1).bfloat16(),
        a=F.normalize(torch.randn(batch, steps, heads, dim, device="cuda"), dim=-1).bfloat16(),
        v=torch.randn(batch, steps, heads, value_dim, **bf16),
        g_head=F.logsigmoid(torch.randn(batch, steps, heads, device="cuda") + 3),
        g_chan=F.logsigmoid(torch.randn(batch, steps, heads, dim, device="cuda") + 3),
        beta=torch.rand(batch, steps, heads, device="cuda").sigmoid(),
        log_gamma=0.1 * torch.randn(heads, dim, device="cuda"),
    )
    for t in x.values():
        t.requires_grad_()
    return x, torch.randn(batch, steps, heads, value_dim, **bf16)


def linrnn_op(cell, x):
    q, k, a, v, gh, gc, beta, lg = (x[n] for n in ("q", "k", "a", "v", "g_head", "g_chan", "beta", "log_gamma"))
    return {
        "gla": lambda: ops.gla(q, k, v, gc, backend="triton")[0],
        "deltanet": lambda: ops.delta_rule(q, k, v, beta, backend="triton")[0],
        "gated_deltanet": lambda: ops.gated_delta_rule(q, k, v, gh, beta, backend="triton")[0],
        "kda": lambda: ops.kda(q, k, v, gc, beta, backend="triton")[0],
        "gammanet": lambda: ops.gammanet(q, k, v, a, gc, beta, lg, backend="triton")[0],
    }[cell]


def fla_op(cell, x):
    import fla.ops.common.chunk_o as fla_chunk_o
    from fla.ops.delta_rule import chunk_delta_rule
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    from fla.ops.generalized_delta_rule import chunk_dplr_delta_rule
    from fla.ops.gla import chunk_gla
    from fla.ops.kda import chunk_kda

    fla_chunk_o.TRITON_ABOVE_3_7_1 = True  # speed only: FLA's gated gradients are not trusted on triton 3.6 Hopper
    q, k, a, v, gh, gc, beta = (x[n] for n in ("q", "k", "a", "v", "g_head", "g_chan", "beta"))
    scale = q.shape[-1] ** -0.5
    return {
        "gla": lambda: chunk_gla(q, k, v, gc, scale=scale)[0],
        "deltanet": lambda: chunk_delta_rule(q, k, v, beta, scale=scale)[0],
        "gated_deltanet": lambda: chunk_gated_delta_rule(q, k, v, gh, beta, scale=scale)[0],
        "kda": lambda: chunk_kda(q, k, v, gc.clamp(min=-5), beta, scale=scale)[0],
        "gammanet": lambda: chunk_dplr_delta_rule(q, k, v, -a * beta[..., None], a, gc, scale=scale)[0],
    }[cell]


def kernel_table(run, repeats):
    """Mean device time per call of every kernel, largest first: [(name, ms, launches per call)]."""
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            run()
        torch.cuda.synchronize()
    times, counts = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name] += event.device_time / 1e3 / repeats
            counts[event.name] += 1 / repeats
    return sorted(((name, ms, counts[name]) for name, ms in times.items()), key=lambda row: -row[1])


def timeline(run, calls=5):
    """Where the time of a call with a sync goes, from one profiler trace of ``calls`` calls (µs, medians): from the
    call's start to its first kernel's start on the GPU, the kernels' busy time, the GPU idle between them, from
    the last kernel's end to the sync's return, and the largest idle gap with the kernels around it."""
    run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            with record_function("timed_call"):
                run()
                torch.cuda.synchronize()
    events = prof.events()
    cuda = torch.autograd.DeviceType.CUDA
    spans = sorted(
        (e.time_range.start, e.time_range.end) for e in events if e.name == "timed_call" and e.device_type != cuda
    )
    # the annotation shows on the GPU's timeline too: not a kernel
    kernels = sorted(
        {(e.time_range.start, e.time_range.end, e.name) for e in events if e.device_type == cuda}
        - {(e.time_range.start, e.time_range.end, e.name) for e in events if e.name == "timed_call"}
    )
    rows = collections.defaultdict(list)
    for start, end in spans:
        inside = [k for k in kernels if start <= k[0] <= end]
        if not inside:
            continue
        gaps = [(b[0] - a[1], a[2], b[2]) for a, b in zip(inside, inside[1:], strict=False)]
        rows["total"].append(end - start)
        rows["to first kernel"].append(inside[0][0] - start)
        rows["kernels busy"].append(sum(k[1] - k[0] for k in inside))
        rows["idle between kernels"].append(sum(max(0.0, g[0]) for g in gaps))
        rows["last kernel to return"].append(end - max(k[1] for k in inside))
        rows["kernels"].append(len(inside))
        if gaps:
            rows["largest gap"].append(max(gaps))
    summary = {name: statistics.median(values) for name, values in rows.items() if name != "largest gap"}
    if rows["largest gap"]:
        summary["largest gap"] = max(rows["largest gap"])
    return summary


def show_timeline(label, run):
    summary = timeline(run)
    gap = summary.pop("largest gap", None)
    print(
        f"-- {label} call + sync timeline (µs, median of 5): " + ", ".join(f"{k} {v:.0f}" for k, v in summary.items())
    )
    if gap:
        print(f"   largest idle gap {gap[0]:.0f} µs, between {gap[1][:40]} and {gap[2][:40]}")


# the launch settings a variant may change, restored before each variant (an older tree may lack some)
SETTINGS = ("WARPS", "STATE_BLOCK_V", "STATE_MIN_PROGRAMS", "FUSED_MAX_K", "FUSED_BLOCK_V", "STAGES_16BIT",
            "KERNEL_STAGES_16BIT", "SOLVE_WU_BLOCK", "SOLVE_KK_BLOCK", "STATE_BWD_LOCAL_FIRST")  # fmt: skip
# variant keys that set one integer setting
INT_SETTINGS = dict(programs="STATE_MIN_PROGRAMS", fused_k="FUSED_MAX_K", fused_bv="FUSED_BLOCK_V",
                    solve_wu_block="SOLVE_WU_BLOCK", solve_kk_block="SOLVE_KK_BLOCK")  # fmt: skip


def launch_settings():
    """A copy of the chunk module's current launch settings (``SETTINGS``)."""
    return {name: copy.deepcopy(getattr(chunk, name)) for name in SETTINGS if hasattr(chunk, name)}


def apply_variant(variant, defaults):
    """Reset the launch settings to ``defaults`` (``launch_settings()``), then apply ``variant`` (see the module
    docstring)."""
    for name, value in defaults.items():
        setattr(chunk, name, copy.deepcopy(value))
    if launch is not None:
        launch.ENABLED = True
    library.KEEP_STATES = True
    for item in filter(None, variant.split(",")):
        key, value = item.split("=")
        if key == "state_stages":
            chunk.STAGES_16BIT[0] = (int(value), chunk.STAGES_16BIT[0][1])
        elif key == "stages":
            chunk.STAGES_16BIT[0] = (chunk.STAGES_16BIT[0][0], int(value))
        elif key in chunk.WARPS:
            chunk.WARPS[key] = int(value)
        elif key.startswith("stages_"):  # a kernel's depth for 16-bit inputs (chunk.KERNEL_STAGES_16BIT)
            chunk.KERNEL_STAGES_16BIT[key.removeprefix("stages_")] = int(value)
        elif key.startswith("bv"):
            chunk.STATE_BLOCK_V[int(key[2:])] = int(value)
        elif key in INT_SETTINGS:
            setattr(chunk, INT_SETTINGS[key], int(value))
        elif key == "cached_launch":  # launch.ENABLED: 0 launches every kernel through Triton's own path
            launch.ENABLED = bool(int(value))
        elif key == "keep_states":  # library.KEEP_STATES: 0 reruns the state pass in the backward
            library.KEEP_STATES = bool(int(value))
        elif key == "local_first":
            chunk.STATE_BWD_LOCAL_FIRST = bool(int(value))
        else:
            raise ValueError(f"unknown launch setting {key!r} in variant {variant!r}")


def wall_median(run, calls=30):
    """Median ms of one call with ``torch.cuda.synchronize()`` inside (host and device, as the pytest benchmarks
    time it)."""
    times = []
    for _ in range(calls + 3):
        start = time.perf_counter()
        run()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[3:])


def measure(forward, x, d_o, repeats):
    """{row: ms} for one op: do_bench and call + sync medians of the forward and the forward+backward, and
    {kernel: ms per call} of each."""
    leaves = list(x.values())

    def forward_backward():
        torch.autograd.grad(forward(), leaves, d_o, allow_unused=True)

    times = {
        "fwd (do_bench median)": triton.testing.do_bench(forward, return_mode="median"),
        "fwd (call + sync median)": wall_median(forward),
        "fwd+bwd (do_bench median)": triton.testing.do_bench(forward_backward, return_mode="median"),
        "fwd+bwd (call + sync median)": wall_median(forward_backward),
    }
    return times, kernel_table(forward, repeats), kernel_table(forward_backward, repeats)


def show(label, results):
    """One table per op: kernels as rows (forward, then forward+backward), one column per variant (or
    implementation)."""
    names = list(results)
    print(f"\n== {label}")
    print(" " * 44 + "".join(f"{n[:14]:>15s}" for n in names))
    for row in next(iter(results.values()))[0]:
        print(f"{row:44s}" + "".join(f"{r[0][row]:15.3f}" for r in results.values()))
    for part, title in ((1, "forward kernels"), (2, "forward+backward kernels")):
        print(f"-- {title} (ms per call)")
        kernels = {}
        for r in results.values():
            for name, ms, _ in r[part]:
                kernels[name[:43]] = max(kernels.get(name[:43], 0), ms)
        sums = [sum(ms for _, ms, _ in r[part]) for r in results.values()]
        print(f"{'sum':44s}" + "".join(f"{total:15.3f}" for total in sums))
        for kernel in sorted(kernels, key=lambda n: -kernels[n]):
            if kernels[kernel] < 0.005:
                continue
            cells = [{n[:43]: ms for n, ms, _ in r[part]}.get(kernel) for r in results.values()]
            print(f"{kernel:44s}" + "".join(f"{c:15.3f}" if c is not None else f"{'-':>15s}" for c in cells))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cells", nargs="+", default=CELLS, choices=CELLS)
    parser.add_argument("--shape", default="8x4096")
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dim", type=int, default=128, help="key width K (and V unless --value-dim)")
    parser.add_argument("--value-dim", type=int, help="value width V (the 340M models: --heads 6 --value-dim 256)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--variants", nargs="+", default=[""], help="launch settings to compare (module docstring)")
    parser.add_argument("--fla", action="store_true", help="also profile FLA 0.6.0's matching op")
    parser.add_argument("--timeline", action="store_true", help="where a call + sync's time goes (host, GPU, idle)")
    args = parser.parse_args()
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    batch, steps = map(int, args.shape.split("x"))
    x, d_o = make_inputs(batch, steps, args.heads, args.dim, args.value_dim)
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "triton", triton.__version__, args.shape)
    defaults = launch_settings()
    for cell in args.cells:
        results = {}
        for variant in args.variants:
            apply_variant(variant, defaults)
            results[variant or "default"] = measure(linrnn_op(cell, x), x, d_o, args.repeats)
        apply_variant("", defaults)
        if args.fla:
            results["FLA"] = measure(fla_op(cell, x), x, d_o, args.repeats)
        show(cell, results)
        if args.timeline:
            leaves = list(x.values())
            for name, make in (("linrnn", linrnn_op), ("FLA", fla_op))[: 2 if args.fla else 1]:
                forward = make(cell, x)
                show_timeline(f"{name} fwd", forward)
                grad = functools.partial(torch.autograd.grad, inputs=leaves, grad_outputs=d_o, allow_unused=True)
                show_timeline(f"{name} fwd+bwd", lambda f=forward, grad=grad: grad(f()))


if __name__ == "__main__":
    main()
