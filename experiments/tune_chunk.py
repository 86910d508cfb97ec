"""Per-kernel GPU timing of the Triton chunk ops under launch-setting variants, for choosing ``triton/chunk.py``'s
settings per cell at the model's shapes (340M: H = 6, K = 128, V = 256, bf16) or others (``--shapes 8x4096x16x128x128``:
B×T×H×K×V).

Each variant runs in its own process (a setting that crashes a kernel takes only its own row): forward+backward
through autograd, as a model uses the ops (kept states), per cell and shape: the median of
``triton.testing.do_bench`` and each kernel's time per call from ``torch.profiler``, and the largest relative
difference of the output and every gradient from the default settings' (a setting that breaks a kernel shows
there; the fp64 check is ``experiments/check_triton_chunk.py``). Variants compile in parallel first, then time one by
one.

A variant is a JSON object: ``warps`` ``{kernel: n}`` (``"*"``: every kernel), ``stages`` (``STAGES_16BIT``),
``kernel_stages`` (``KERNEL_STAGES_16BIT``), ``local_first`` (``STATE_BWD_LOCAL_FIRST``), ``min_programs``
(``STATE_MIN_PROGRAMS``), ``keep_intra`` (``library.KEEP_INTRA``), ``state_block_v`` (``STATE_BLOCK_V`` entries,
e.g. ``{"128": 128}``), ``fused_block_v`` (``FUSED_BLOCK_V``), ``output_block_v`` (``OUTPUT_BLOCK_V``). Run on the
device with the carried wheels on PYTHONPATH::

    python3 experiments/tune_chunk.py --cells gammanet kda --shapes 4x4096 1x16384 > $OUT/tune.jsonl

and summarise with ``python3 experiments/tune_chunk.py --report tune.jsonl``.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys

DEFAULT_VARIANTS = [
    {},
    {"keep_intra": "always"},
    {"keep_intra": "never"},
    {"warps": {"*": 1}},
    {"warps": {"*": 2}},
    {"warps": {"*": 4}},
    {"warps": {"*": 8}},
    {"stages": [[1, 2], [1, 2]]},
    {"stages": [[3, 3], [1, 2]]},
    {"stages": [[2, 2], [1, 2]]},
    {"stages": [[2, 4], [1, 2]]},
    {"local_first": True},
    {"min_programs": 64},
    {"min_programs": 256},
]
HEADS, KEY_DIM, VALUE_DIM = 6, 128, 256  # a shape "BxT" is the 340M model's heads; "BxTxHxKxV" names them


def parse_shape(shape: str) -> tuple[int, int, int, int, int]:
    """(batch, steps, heads, key width, value width) of "BxT" or "BxTxHxKxV"."""
    sizes = [int(x) for x in shape.split("x")]
    return (*sizes, HEADS, KEY_DIM, VALUE_DIM) if len(sizes) == 2 else tuple(sizes)


def apply(variant: dict) -> None:
    from linrnn.kernels import library
    from linrnn.kernels.triton import chunk

    warps = variant.get("warps", {})
    for name in chunk.WARPS:
        chunk.WARPS[name] = warps.get(name, warps.get("*", chunk.WARPS[name]))
    if "stages" in variant:
        chunk.STAGES_16BIT[:] = [tuple(pair) for pair in variant["stages"]]
    if "kernel_stages" in variant:
        chunk.KERNEL_STAGES_16BIT.clear()
        chunk.KERNEL_STAGES_16BIT.update(variant["kernel_stages"])
    if "local_first" in variant:
        chunk.STATE_BWD_LOCAL_FIRST = variant["local_first"]
    if "min_programs" in variant:
        chunk.STATE_MIN_PROGRAMS = variant["min_programs"]
    if "keep_intra" in variant:
        library.KEEP_INTRA = variant["keep_intra"]
    if "state_block_v" in variant:  # {key width: value columns per state-pass program}
        chunk.STATE_BLOCK_V.update({int(width): block for width, block in variant["state_block_v"].items()})
    if "fused_block_v" in variant:
        chunk.FUSED_BLOCK_V = variant["fused_block_v"]
    if "output_block_v" in variant:
        chunk.OUTPUT_BLOCK_V = variant["output_block_v"]


def inputs(cell: str, batch: int, steps: int, heads: int, key_dim: int, value_dim: int):
    import torch
    import torch.nn.functional as F

    generator = torch.Generator(device="cuda").manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device="cuda", generator=generator)

    shape = (batch, steps, heads)
    tensors = dict(q=randn(*shape, key_dim).bfloat16(), k=F.normalize(randn(*shape, key_dim), dim=-1).bfloat16(),
                   v=randn(*shape, value_dim).bfloat16(), beta=randn(*shape).sigmoid(),
                   g=F.logsigmoid(randn(*shape, key_dim) + 3))  # fmt: skip
    if cell == "gammanet":
        tensors["a"] = F.normalize(randn(*shape, key_dim), dim=-1).bfloat16()
        tensors["log_gamma"] = 0.1 * randn(heads, key_dim)
    if cell == "gated_deltanet":
        tensors["g"] = F.logsigmoid(randn(*shape) + 3)
    for x in tensors.values():
        x.requires_grad_()
    return tensors, randn(*shape, value_dim).bfloat16()


def run_variant(variant: dict, cells: list[str], shapes: list[str], reference: str | None, warm_only: bool) -> None:
    import torch
    import triton

    from linrnn import ops

    apply(variant)
    calls = {
        "kda": lambda t: ops.kda(t["q"], t["k"], t["v"], t["g"], t["beta"], backend="triton"),
        "gammanet": lambda t: ops.gammanet(
            t["q"], t["k"], t["v"], t["a"], t["g"], t["beta"], t["log_gamma"], backend="triton"
        ),  # fmt: skip
        "gated_deltanet": lambda t: ops.gated_delta_rule(t["q"], t["k"], t["v"], t["g"], t["beta"], backend="triton"),
    }
    results = {}
    for cell in cells:
        for shape in shapes:
            batch, steps, heads, key_dim, value_dim = parse_shape(shape)
            if warm_only:
                batch, steps = 1, 128
            tensors, d_out = inputs(cell, batch, steps, heads, key_dim, value_dim)
            leaves = list(tensors.values())

            def step(call=calls[cell], tensors=tensors, d_out=d_out):
                call(tensors)[0].backward(d_out)

            step()
            if warm_only:
                continue
            for x in leaves:
                x.grad = None
            out = calls[cell](tensors)[0]
            out.backward(d_out)
            # copies: do_bench's first call accumulates into the fp32 gradients in place
            values = {"o": out.detach().float(), **{n: x.grad.float().clone() for n, x in tensors.items()}}
            key = f"{cell}_{shape}"
            results[key] = values
            error = None
            if reference is not None and os.path.exists(reference):
                base = torch.load(reference, weights_only=True)[key]
                error = max(float((values[n] - base[n]).norm() / base[n].norm().clamp_min(1e-30)) for n in values)
            median = triton.testing.do_bench(step, return_mode="median", grad_to_none=leaves)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            kernels = {e.key: round(e.self_device_time_total / e.count, 1) for e in profile.key_averages()
                       if e.self_device_time_total > 0 and ("chunk" in e.key or "fold" in e.key)}  # fmt: skip
            print(json.dumps(dict(variant=variant, cell=cell, shape=shape, ms=round(median, 3), rel_error=error,
                                  kernels_us=kernels)), flush=True)  # fmt: skip
    if reference is not None and not os.path.exists(reference) and not warm_only:
        torch.save(results, reference)


def report(path: str) -> None:
    rows = [json.loads(line) for line in open(path) if line.startswith("{")]
    base = {(r["cell"], r["shape"]): r for r in rows if r["variant"] == {}}
    for (cell, shape), b in base.items():
        print(f"\n{cell} {shape}: default {b['ms']:.3f} ms")
        for r in rows:
            if (r["cell"], r["shape"]) != (cell, shape) or r["variant"] == {}:
                continue
            changes = []
            for name, us in sorted(r["kernels_us"].items()):
                before = b["kernels_us"].get(name)
                if before is not None and abs(us - before) > 0.03 * before:
                    changes.append(f"{name.replace('_kernel', '')} {before:.0f}->{us:.0f}")
            error = "" if r["rel_error"] is None else f" err {r['rel_error']:.1e}"
            print(f"  {json.dumps(r['variant']):45s} {r['ms']:.3f} ms ({r['ms'] / b['ms']:.3f}){error}  "
                  + ", ".join(changes))  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cells", nargs="+", default=["gammanet", "kda"])
    parser.add_argument("--shapes", nargs="+", default=["4x4096", "1x16384"])
    parser.add_argument("--variants", help="a JSON list of variants (default: the built-in list)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one variant, in a child process
    parser.add_argument("--warm-only", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--reference", default="/tmp/tune_chunk_reference.pt")
    parser.add_argument("--report", metavar="JSONL", help="summarise an earlier run's output and exit")
    args = parser.parse_args()
    if args.report:
        return report(args.report)
    if args.variant is not None:
        return run_variant(json.loads(args.variant), args.cells, args.shapes, args.reference, args.warm_only)
    variants = json.loads(args.variants) if args.variants else DEFAULT_VARIANTS
    if os.path.exists(args.reference):
        os.remove(args.reference)

    def child(variant, warm_only):
        command = [
            sys.executable,
            __file__,
            "--variant",
            json.dumps(variant),
            "--cells",
            *args.cells,
            "--shapes",
            *args.shapes,
            "--reference",
            args.reference,
        ] + (["--warm-only"] if warm_only else [])
        return subprocess.run(command, capture_output=True, text=True)  # fmt: skip

    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # compiles, CPU-bound: in parallel
        for variant, done in zip(variants, pool.map(lambda v: child(v, True), variants), strict=True):
            if done.returncode:
                print(f"# warm-up of {json.dumps(variant)} failed: {done.stderr.strip().splitlines()[-1:]}", flush=True)
    for variant in variants:  # the default first: it writes the reference
        done = child(variant, False)
        sys.stdout.write(done.stdout)
        if done.returncode:
            print(f"# {json.dumps(variant)} failed: {done.stderr.strip().splitlines()[-3:]}", flush=True)


if __name__ == "__main__":
    main()
