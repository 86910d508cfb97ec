"""Seed 000 §4.3's multiplier before the output RMSNorm: which width scaling does the recurrence output follow in
training, and does the multiplier change anything measurable?

Trains the ``tiny`` model of each cell at several widths under gdn-mup (AdamW, base width 64, untied readout
started at zero), on random windows of the given text files (streaming, as in pre-training) or, without
``--text``, on one fixed batch of the demo's sonnets (memorisation). At a few steps it records, for the last
layer's mixer:

- the raw read o = scale · Sᵀq̂ (before the multiplier; scale = 1/√d_k in the kernels), and the same read with q̂
  replaced by a random unit vector: their ratio says how far q̂ has aligned with the state (1 = independent);
- the slope of log(o · √d_k) and of log(o · d_k) against log width: the first is flat if q̂ is aligned with S
  (the read is Θ(1/√d_k)), the second if q̂ stays independent of S (Θ(1/d_k); seed 000 App. C.4 reports that);
- the training loss with the multiplier (d_k / d_k0) on and off, and the RMSNorm's input and output sizes.

    python experiments/prenorm_multiplier.py --text corpus/*.txt [--steps 300] [--widths 64 128 256 512]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import linrnn  # noqa: E402
from linrnn import parametrizations  # noqa: E402
from linrnn.text import text_bytes  # noqa: E402

BATCH, SEQ_LEN = 8, 64


def batches(text: torch.Tensor | None, steps: int, seed: int):
    """Yields (inputs, targets) [BATCH, SEQ_LEN]: random windows of ``text``, or the sonnets' first batch."""
    if text is None:
        windows = text_bytes()[: BATCH * SEQ_LEN + 1]
        fixed = windows[:-1].view(BATCH, SEQ_LEN), windows[1:].view(BATCH, SEQ_LEN)
        for _ in range(steps + 1):
            yield fixed
        return
    generator = torch.Generator().manual_seed(seed)
    for _ in range(steps + 1):
        starts = torch.randint(0, len(text) - SEQ_LEN - 1, (BATCH,), generator=generator)
        windows = torch.stack([text[s : s + SEQ_LEN + 1] for s in starts.tolist()])
        yield windows[:, :-1], windows[:, 1:]


def train(cell, width, multiplier, text, steps, lr, checkpoints, seed=0) -> dict[int, dict[str, float]]:
    torch.manual_seed(seed)
    model = linrnn.build_model(cell, hidden_size=width, intermediate_size=4 * width, tie_embeddings=False)
    applied = parametrizations.apply(
        model, "gdn-mup", base_width=64, pre_norm_multiplier=multiplier, readout_zero_init=True
    )
    optimizer = torch.optim.AdamW(applied.param_groups(lr), weight_decay=0.0)
    mixer = model.layers[-1].mixer
    seen = {}
    hooks = [
        mixer.register_forward_pre_hook(lambda module, args: seen.update(x=args[0].detach())),
        mixer.o_norm.register_forward_hook(
            lambda module, args, out: seen.update(
                norm_in=float(args[0].detach().abs().mean()), norm_out=float(out.detach().abs().mean())
            )
        ),
    ]
    records = {}
    for step, (inputs, targets) in enumerate(batches(text, steps, seed)):
        loss = F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())
        if step in checkpoints:
            with torch.no_grad():
                projected = mixer.project(seen["x"])
                q, k, v, extra, _ = mixer.streams(projected)
                gates = mixer.gates(projected, k, extra)
                read, _ = mixer.op(q, k, v, **gates, backend="reference")
                random_q = F.normalize(torch.randn_like(q), dim=-1)
                random_read, _ = mixer.op(random_q, k, v, **gates, backend="reference")
            records[step] = dict(
                loss=float(loss.detach()),
                read=float(read.abs().mean()),
                random_read=float(random_read.abs().mean()),
                norm_in=seen["norm_in"],
                norm_out=seen["norm_out"],
                d_k=mixer.head_k_dim,
            )
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    for hook in hooks:
        hook.remove()
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", nargs="+", default=["gated_deltanet", "kda"])
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--text", nargs="+", help="text files to stream windows from (default: one fixed batch)")
    args = parser.parse_args()
    torch.set_num_threads(2)
    text = None
    if args.text:
        raw = b"".join(Path(name).read_bytes() for name in args.text)
        text = torch.frombuffer(bytearray(raw), dtype=torch.uint8).long()
    checkpoints = sorted({0, 3, 10, 30, 100, args.steps} & set(range(args.steps + 1)))
    log_widths = np.log(args.widths)
    for cell in args.cells:
        runs = {
            (w, on): train(cell, w, on, text, args.steps, args.lr, checkpoints)
            for w in args.widths
            for on in (True, False)
        }
        print(f"\n{cell}, gdn-mup AdamW {args.lr:g}, {'streaming' if text is not None else 'one fixed batch'}")
        print("| step | slope o·√d_k | slope o·d_k | learned / random read, per width | loss on / off, widest |")
        print("|---:|---:|---:|---|---|")
        for step in checkpoints:
            rows = [runs[(w, True)][step] for w in args.widths]
            read = np.array([r["read"] for r in rows])
            d_k = np.array([r["d_k"] for r in rows])
            ratios = " ".join(f"{r['read'] / r['random_read']:.2f}" for r in rows)
            widest = runs[(args.widths[-1], True)][step]["loss"], runs[(args.widths[-1], False)][step]["loss"]
            print(
                f"| {step} | {np.polyfit(log_widths, np.log(read * np.sqrt(d_k)), 1)[0]:+.2f} | "
                f"{np.polyfit(log_widths, np.log(read * d_k), 1)[0]:+.2f} | {ratios} | "
                f"{widest[0]:.4f} / {widest[1]:.4f} |"
            )
        print("| width | loss on / off | RMSNorm input on / off | RMSNorm output on / off |  (last step)")
        print("|---:|---|---|---|")
        for w in args.widths:
            on, off = runs[(w, True)][checkpoints[-1]], runs[(w, False)][checkpoints[-1]]
            print(
                f"| {w} | {on['loss']:.4f} / {off['loss']:.4f} | {on['norm_in']:.2e} / {off['norm_in']:.2e} | "
                f"{on['norm_out']:.3f} / {off['norm_out']:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
