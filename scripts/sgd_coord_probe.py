"""A longer coordinate check with the sweep's SGD step (docs/sweeps.md, "Why do the muP variants learn less under
SGD"): the sweep's model and optimizer (Nesterov momentum 0.98, clipping at 1, warmup then cosine) on the
embedded corpus, at several widths, recording every module's mean |output coordinate| at every training step.
Prints, per parametrization, the training loss per width and the modules whose size moves most with width
(slope of log size against log width), and writes everything to a JSON file. ``--kernel`` instead prints, at
init, the overlap K = h·h'/n of the final hidden states (the readout's input) between positions of one batch:
what one SGD step of the readout at one position does to the logits at the others is proportional to it.

    python scripts/sgd_coord_probe.py --params sp mup gdn-mup --widths 128 256 512 --steps 40 \\
        --json docs/results/sweeps/gdn_sgd_coord_probe.json
"""

import argparse
import json
import re
from collections import defaultdict

import numpy as np
import torch

import linrnn.training.sweep as sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="gdn")
    parser.add_argument("--params", nargs="+", default=["sp", "mup", "gdn-mup"])
    parser.add_argument("--widths", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--lr", type=float, default=0.316)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=float, default=0.25, help="warmup fraction (the sweep: 10 of 100 steps)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--readout-bias", action="store_true", help="a logit bias outside the logit multiplier")
    parser.add_argument("--report-steps", nargs="+", type=int, default=[1, 5, 10, 20, 30, 40])
    parser.add_argument("--json", help="write the sizes here")
    parser.add_argument("--kernel", action="store_true", help="print the readout's input overlaps at init, then stop")
    args = parser.parse_args()

    config = sweep.SweepConfig(
        cells=[args.cell], optimizers=["sgd"], parametrizations=args.params, widths=args.widths,
        lrs={"adamw": [1e-3], "sgd": [args.lr]}, steps=args.steps, warmup_fraction=args.warmup, num_layers=args.layers,
        batch_size=args.batch_size, seq_len=args.seq_len, max_norm=args.max_norm, validation_batches=1,
        readout_bias=args.readout_bias,
    )  # fmt: skip
    corpus = sweep.Corpus(config)
    if args.kernel:
        readout_kernel(config, corpus)
        return
    sizes: dict = defaultdict(dict)  # (param, width) → module → [size per step]
    losses: dict = {}
    build = sweep.build_model

    def build_with_hooks(config, run, device):
        model = build(config, run, device)
        record = sizes[(run.parametrization, run.width)]

        def hook(name):
            def store(module, inputs, output):
                tensor = output[0] if isinstance(output, tuple) else output
                if module.training and isinstance(tensor, torch.Tensor) and tensor.is_floating_point():
                    record.setdefault(name, []).append(float(tensor.detach().abs().mean()))

            return store

        for name, module in model.named_modules():
            if name.startswith("model.") and not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
                module.register_forward_hook(hook(name.removeprefix("model.")))
        model.register_forward_hook(hook("logits"))
        return model

    sweep.build_model = build_with_hooks
    for param in config.parametrizations:
        for width in config.widths:
            run = sweep.Run(cell=config.cells[0], optimizer="sgd", parametrization=param, width=width, lr=args.lr)
            row = sweep.train_run(config, run, corpus, torch.device("cpu"))
            losses[(param, width)] = row["loss_curve"]
            print(f"{param} w{width}: loss every 10th step {row['loss_curve']}, grad norms {row['grad_norm_curve']}")

    def family(name: str) -> str:
        """layers.3.mixer.q_proj → mixer.q_proj: slopes are taken per layer, then the largest per family kept."""
        return re.sub(r"^layers\.\d+\.", "", name)

    log_widths = np.log(np.array(config.widths, dtype=float))
    report = {}
    for param in config.parametrizations:
        print(f"\n## {param}: slope of log mean |coordinate| against log width (largest |slope| over layers)")
        slopes = {}
        for step in args.report_steps:
            per_family = defaultdict(list)
            for name in sizes[(param, config.widths[0])]:
                values = [sizes[(param, w)][name] for w in config.widths]
                if any(len(v) < step for v in values):
                    continue
                y = np.log(np.maximum([v[step - 1] for v in values], 1e-30))
                per_family[family(name)].append((float(np.polyfit(log_widths, y, 1)[0]), name))
            slopes[step] = {f: max(v, key=lambda s: abs(s[0])) for f, v in per_family.items()}
        last = args.report_steps[-1]
        worst = sorted(slopes[last], key=lambda f: -abs(slopes[last][f][0]))[:12]
        print("| module (worst layer at the last step) | " + " | ".join(f"step {s}" for s in args.report_steps) + " |")
        print("|---|" + "---|" * len(args.report_steps))
        for f in worst:
            cells = [f"{slopes[s][f][0]:+.2f}" if f in slopes[s] else "–" for s in args.report_steps]
            print(f"| {slopes[last][f][1]} | " + " | ".join(cells) + " |")
        report[param] = {str(s): slopes[s] for s in args.report_steps}
    if args.json:
        with open(args.json, "w") as file:
            json.dump(
                {
                    "settings": config.settings(), "lr": args.lr,
                    "loss_curves": {f"{p} w{w}": c for (p, w), c in losses.items()},
                    "sizes": {f"{p} w{w}": s for (p, w), s in sizes.items()}, "slopes": report,
                },
                file,
            )  # fmt: skip


@torch.no_grad()
def readout_kernel(config, corpus) -> None:
    """Mean of K = h_t·h_s / n over pairs of positions t ≠ s of the first training batch, with the same token id
    and with different ids, at init (h: the final norm's output, the readout's input)."""
    inputs, _ = next(corpus.batches(corpus.train))
    ids = inputs["input"].flatten()
    same = (ids[:, None] == ids[None, :]).float() - torch.eye(len(ids))
    different = (ids[:, None] != ids[None, :]).float()
    print(f"positions: {len(ids)}; pairs with the same token id: {float(same.sum() / (len(ids) ** 2 - len(ids))):.2%}")
    print("| parametrization | width | K, same id | K, different ids: mean | mean abs |")
    print("|---|---|---|---|---|")
    for param in config.parametrizations:
        for width in config.widths:
            run = sweep.Run(cell=config.cells[0], optimizer="sgd", parametrization=param, width=width, lr=1.0)
            model = sweep.build_model(config, run, torch.device("cpu"))
            captured = {}
            model.model.norm.register_forward_hook(lambda module, args, output, into=captured: into.update(h=output))
            model(inputs["input"], positions=inputs["positions"])
            h = captured["h"].flatten(0, 1)  # [positions, width]
            kernel = h @ h.T / width
            mean = [float((kernel * mask).sum() / mask.sum()) for mask in (same, different)]
            abs_mean = float((kernel.abs() * different).sum() / different.sum())
            print(f"| {param} | {width} | {mean[0]:.3f} | {mean[1]:.2e} | {abs_mean:.4f} |")


if __name__ == "__main__":
    main()
