"""Device time of the short convolution's Triton kernels per launch setting (GPU; `triton.testing.do_bench`
medians), for one or more source trees, to choose the tile shapes and warp counts of the forward and backward.

Each tree's ``linrnn/kernels/triton/short_conv.py`` is imported on its own and its kernels are launched directly
with each setting ``BT,BC,WARPS[,SPAN]``: the forward on ``[BT, BC]`` tiles; the backward with ``SPAN`` rows of
``BC`` channels per program where its kernel walks rows (a ``SPAN`` argument), else on ``[BT, BC]`` tiles (the
tiled backward of earlier versions). Inputs are shaped like the 340M models' mixer (x a [B, T, 3072] column slice of
the fused projection's output, W = 4, bf16): rows 4×4096 and 1×16384, and 1×16384 packed into 17 documents. The
backward's time includes the sum of its ``dw`` partials. The last column is the largest difference of y, dx and dw
from the first setting timed at that shape, relative to its largest value (a wrong setting shows there).

    python3 experiments/time_short_conv.py --trees . .old --settings 32,128,4 32,512,4,128
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import triton
from triton.testing import do_bench

CHANNELS, WIDTH, PROJECTION = 3072, 4, 3072 + 1536  # the fused projection also holds the gates' columns


def load_module(tree: str):
    path = Path(tree) / "linrnn/kernels/triton/short_conv.py"
    spec = importlib.util.spec_from_file_location(f"short_conv_{abs(hash(tree))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inputs(batch: int, steps: int, documents: int):
    torch.manual_seed(0)
    wide = torch.randn(batch, steps, PROJECTION, device="cuda", dtype=torch.bfloat16)
    x = wide[:, :, :CHANNELS]
    weight = torch.randn(CHANNELS, WIDTH, device="cuda") / WIDTH
    dy = torch.randn(batch, steps, CHANNELS, device="cuda", dtype=torch.bfloat16)
    offset = None
    if documents > 1:
        cuts = torch.linspace(0, steps, documents + 1).long().tolist()
        offset = torch.cat([torch.arange(e - s) for s, e in zip(cuts, cuts[1:], strict=False)]).int().cuda()
    return x, weight, dy, offset


def parse_setting(text: str) -> tuple[int, int, int, int]:
    """``"BT,BC,WARPS[,SPAN]"`` → (BT, BC, WARPS, SPAN), SPAN = BT when left out."""
    setting = tuple(int(value) for value in text.split(","))
    return setting if len(setting) == 4 else (*setting, setting[0])


def forward(module, setting, x, weight, offset):
    bt, bc, warps, _ = setting
    batch, steps, _ = x.shape
    y = torch.empty(batch, steps, CHANNELS, device="cuda", dtype=x.dtype)
    grid = (triton.cdiv(steps, bt), triton.cdiv(CHANNELS, bc), batch)
    module._short_conv_fwd_kernel[grid](x, weight, None, offset, y, steps, CHANNELS, x.stride(0), x.stride(1),
                                        W=WIDTH, BT=bt, BC=bc, HAS_HISTORY=False, IS_VARLEN=offset is not None,
                                        num_warps=warps)  # fmt: skip
    return y


def backward(module, setting, x, weight, dy, offset):
    """``BT`` rows per program for a kernel without ``SPAN``; else ``SPAN`` rows (and ``BT`` only if it has one)."""
    bt, bc, warps, span = setting
    batch, steps, _ = x.shape
    names = module._short_conv_bwd_kernel.arg_names
    extra = {name: value for name, value in (("BT", bt), ("SPAN", span)) if name in names}
    rows = span if "SPAN" in names else bt
    grid = (triton.cdiv(steps, rows), triton.cdiv(CHANNELS, bc), batch)
    dx = torch.empty(batch, steps, CHANNELS, device="cuda", dtype=x.dtype)
    partial = torch.empty(batch * grid[0], CHANNELS, WIDTH, device="cuda")
    module._short_conv_bwd_kernel[grid](x, weight, None, offset, dy, dx, partial, steps, CHANNELS, x.stride(0),
                                        x.stride(1), W=WIDTH, BC=bc, HAS_HISTORY=False, IS_VARLEN=offset is not None,
                                        num_warps=warps, **extra)  # fmt: skip
    return dx, partial.sum(0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs="+", default=["."])
    parser.add_argument("--settings", nargs="+", default=["32,128,4"], help="BT,BC,WARPS[,SPAN] (the docstring)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    settings = [parse_setting(text) for text in args.settings]
    shapes = [("4x4096 rows", 4, 4096, 1), ("1x16384 rows", 1, 16384, 1), ("1x16384 packed(17)", 1, 16384, 17)]
    rows = []
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    print("| shape | tree | BT,BC,warps,span | fwd µs | bwd µs | max |dx - ref| / max |ref| |")
    print("|---|---|---|---:|---:|---:|")
    for label, batch, steps, documents in shapes:
        x, weight, dy, offset = inputs(batch, steps, documents)
        reference = None
        for tree in args.trees:
            module = load_module(tree)
            for setting in settings:
                try:
                    dx, dw = backward(module, setting, x, weight, dy, offset)
                    y = forward(module, setting, x, weight, offset)
                    if reference is None:
                        reference = (y.float(), dx.float(), dw)
                    error = max(
                        ((got.float() - want).abs().max() / want.abs().max()).item()
                        for got, want in zip((y, dx, dw), reference, strict=True)
                    )
                    run = (module, setting, x, weight)
                    fwd = do_bench(lambda run=run, offset=offset: forward(*run, offset), rep=200) * 1e3
                    bwd = do_bench(lambda run=run, grad=(dy, offset): backward(*run, *grad), rep=200) * 1e3
                except Exception as failure:  # noqa: BLE001 - a setting that fails to compile or launch is reported
                    reason = f"{type(failure).__name__} {failure}".replace("\n", " ")
                    print(f"| {label} | {tree} | {setting} | failed: {reason} |")
                    continue
                rows.append({"shape": label, "tree": tree, "setting": setting, "fwd_us": fwd, "bwd_us": bwd,
                             "error": error})  # fmt: skip
                print(f"| {label} | {tree} | {setting} | {fwd:.1f} | {bwd:.1f} | {error:.1e} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
