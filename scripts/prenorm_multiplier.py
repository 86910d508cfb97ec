"""Does seed 000 §4.3's multiplier before the output RMSNorm change anything measurable?

Trains the ``tiny`` GDN (and KDA) model at several widths under gdn-mup (AdamW, base width 64) with the multiplier
on and off, same seed, same data (the demo's sonnet windows), and prints the final training loss of each and
the mean |coordinate| of the RMSNorm's input and output in the last step. The multiplier rescales the RMSNorm's
input, so without eps it would change nothing; the printout shows how much eps makes it matter.

    python scripts/prenorm_multiplier.py [--steps 100] [--widths 64 256 1024]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import linrnn  # noqa: E402
from linrnn import parametrizations  # noqa: E402
from linrnn.text import text_bytes  # noqa: E402


def train(cell: str, width: int, multiplier: bool, steps: int, lr: float) -> tuple[float, float, float]:
    torch.manual_seed(0)
    model = linrnn.build_model(cell, hidden_size=width, intermediate_size=4 * width)
    applied = parametrizations.apply(model, "gdn-mup", base_width=64, pre_norm_multiplier=multiplier)
    optimizer = torch.optim.AdamW(applied.param_groups(lr))
    data = text_bytes()
    windows = data[: 8 * 64 + 1]
    inputs, targets = windows[:-1].view(8, 64), windows[1:].view(8, 64)
    sizes = {}
    norm = model.layers[-1].mixer.o_norm

    def record(module, args, out):
        sizes.update(inp=float(args[0].detach().abs().mean()), out=float(out.detach().abs().mean()))

    hook = norm.register_forward_hook(record)
    for _ in range(steps):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    hook.remove()
    return float(loss), sizes["inp"], sizes["out"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", nargs="+", default=["gated_deltanet", "kda"])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()
    torch.set_num_threads(2)
    print("| cell | width | loss, multiplier on | loss, off | RMSNorm input, on / off | RMSNorm output, on / off |")
    print("|---|---:|---:|---:|---:|---:|")
    for cell in args.cells:
        for width in args.widths:
            on, off = (train(cell, width, flag, args.steps, args.lr) for flag in (True, False))
            print(f"| {cell} | {width} | {on[0]:.4f} | {off[0]:.4f} | {on[1]:.2e} / {off[1]:.2e} | "
                  f"{on[2]:.3f} / {off[2]:.3f} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
