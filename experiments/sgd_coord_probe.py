"""A longer coordinate check with the sweep's SGD step (docs/sweeps.md, "Why do the muP variants learn less under
SGD"): the sweep's model and optimizer (Nesterov momentum 0.98, or ``--optimizer adamw``; clipping at 1, warmup
then cosine) on the embedded corpus, at several widths. At every training step it records, per module, three
mean |coordinate|s: its output ("out"); what the change of its weights since init contributes to that output
("update", for linear layers and the embedding: (W_t - W_0) x); and the loss's gradient with respect to the
output ("grad"). The "_shared" variants take the mean over the batch's positions first (the part every token
shares). It also records every parameter's gradient norm before clipping. Prints, per parametrization and metric,
the modules whose sizes depart most from muP's prediction (slope of log size against log width: 0 for out and
update, -1 for grad) and writes everything to a JSON file. ``--kernel`` instead prints, at init, the overlap
K = h·h'/n of the final hidden states (the readout's input) between positions of one batch: what one SGD step of
the readout at one position does to the logits at the others is proportional to it.

    python experiments/sgd_coord_probe.py --params sp mup gdn-mup --widths 128 256 512 --steps 40 \\
        --json docs/results/sweeps/gdn_sgd_coord_probe.json
"""

import argparse
import json
import re
from collections import defaultdict

import numpy as np
import torch
import torch.nn.functional as F

import linrnn.training.sweep as sweep


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cell", default="gdn")
    parser.add_argument("--params", nargs="+", default=["sp", "mup", "gdn-mup"])
    parser.add_argument("--widths", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd", help="as the sweep sets it up")
    parser.add_argument("--lr", type=float, default=0.316)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=float, default=0.25, help="warmup fraction (the sweep: 10 of 100 steps)")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--max-norm", type=float, default=1.0)
    parser.add_argument("--readout-bias", action="store_true", help="a logit bias outside the logit multiplier")
    parser.add_argument("--heads-grow", action="store_true", help="heads grow with width (fixed head dimensions)")
    parser.add_argument("--report-steps", nargs="+", type=int, default=[1, 5, 10, 20, 30, 40])
    parser.add_argument("--json", help="write the sizes here")
    parser.add_argument("--save-every", type=int, default=1, help="steps between the sizes written to --json")
    parser.add_argument("--save-first", type=int, default=0, help="and every one of the first steps")
    parser.add_argument("--metrics", nargs="+", default=["out", "update", "grad"], choices=list(PREDICTIONS))
    parser.add_argument("--rows", type=int, default=12, help="modules per table")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kernel", action="store_true", help="print the readout's input overlaps at init, then stop")
    args = parser.parse_args()

    config = sweep.SweepConfig(
        cells=[args.cell], optimizers=[args.optimizer], parametrizations=args.params, widths=args.widths,
        lrs={args.optimizer: [args.lr]}, steps=args.steps, warmup_fraction=args.warmup, num_layers=args.layers,
        batch_size=args.batch_size, seq_len=args.seq_len, max_norm=args.max_norm, validation_batches=1,
        readout_bias=args.readout_bias, heads_grow=args.heads_grow,
    )  # fmt: skip
    corpus = sweep.Corpus(config)
    if args.kernel:
        readout_kernel(config, corpus)
        return
    device = torch.device(args.device)
    # (param, width) → metric → module → [value per step]; values stay on the device until the run ends
    records: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    output_dims: dict = defaultdict(dict)  # width → module → its output's last dimension
    parameter_names: dict = {}  # (param, width) → names in model.parameters() order
    losses: dict = {}
    build = sweep.build_model

    def build_with_hooks(config, run, device):
        model = build(config, run, device)
        record = records[(run.parametrization, run.width)]
        dims = output_dims[run.width]
        initial = {name: p.detach().clone() for name, p in model.named_parameters()}
        parameter_names[(run.parametrization, run.width)] = [name.removeprefix("model.") for name in initial]

        def shared(tensor):
            """Mean |coordinate| of the output's mean over the batch's positions: its part shared by every token."""
            return tensor.detach().float().mean(dim=(0, 1)).abs().mean()

        def store_grad(name, grad):
            record["grad"][name].append(grad.detach().float().abs().mean())
            record["grad_shared"][name].append(shared(grad))

        def hook(name):
            def store(module, inputs, output):
                tensor = output[0] if isinstance(output, tuple) else output
                if not (module.training and isinstance(tensor, torch.Tensor) and tensor.is_floating_point()):
                    return
                dims[name] = tensor.shape[-1]
                record["out"][name].append(tensor.detach().float().abs().mean())
                record["out_shared"][name].append(shared(tensor))
                if tensor.requires_grad:
                    tensor.register_hook(lambda grad: store_grad(name, grad))
                with torch.no_grad():  # what the weights' change since init contributes to the output
                    if isinstance(module, torch.nn.Linear):
                        change = module.weight - initial[f"model.{name}.weight"]
                        record["update"][name].append(F.linear(inputs[0], change).float().abs().mean())
                    elif isinstance(module, torch.nn.Embedding):
                        change = module.weight - initial[f"model.{name}.weight"]
                        record["update"][name].append(F.embedding(inputs[0], change).float().abs().mean())

            return store

        for name, module in model.named_modules():
            if name.startswith("model.") and not isinstance(module, (torch.nn.ModuleList, torch.nn.Sequential)):
                module.register_forward_hook(hook(name.removeprefix("model.")))
        model.register_forward_hook(hook("logits"))
        return model

    sweep.build_model = build_with_hooks
    clip = torch.nn.utils.clip_grad_norm_
    gradient_norms: list = []  # per step: every parameter's gradient norm before clipping

    def clip_and_record(parameters, *args, **kwargs):
        parameters = list(parameters)
        gradient_norms.append(torch.stack(torch._foreach_norm([p.grad for p in parameters])).float())
        return clip(parameters, *args, **kwargs)

    torch.nn.utils.clip_grad_norm_ = clip_and_record
    sizes: dict = {}  # (param, width) → metric → module → [float per step]
    for param in config.parametrizations:
        for width in config.widths:
            run = sweep.Run(
                cell=config.cells[0], optimizer=args.optimizer, parametrization=param, width=width, lr=args.lr
            )
            row = sweep.train_run(config, run, corpus, device)
            losses[(param, width)] = row["loss_curve"]
            sizes[(param, width)] = {
                metric: {name: torch.stack(values).cpu().tolist() for name, values in by_module.items()}
                for metric, by_module in records.pop((param, width)).items()
            }
            names = parameter_names.pop((param, width))
            norms = torch.stack(gradient_norms).T.cpu().tolist()
            gradient_norms.clear()
            sizes[(param, width)]["grad_norm"] = dict(zip(names, norms, strict=True))
            print(f"{param} w{width}: loss every 10th step {row['loss_curve']}, val {row['val_loss']}")

    def family(name: str) -> str:
        """layers.3.mixer.q_proj → mixer.q_proj: slopes are taken per layer, then the largest per family kept."""
        return re.sub(r"^layers\.\d+\.", "", name)

    log_widths = np.log(np.array(config.widths, dtype=float))
    report = {}
    for param in config.parametrizations:
        report[param] = {}
        for metric in args.metrics:
            print(f"\n## {param}, {metric}: slope of log mean |coordinate| against log width; the layer farthest "
                  f"from muP's prediction ({PREDICTIONS[metric]})")  # fmt: skip
            slopes = {}
            first = sizes[(param, config.widths[0])][metric]
            for step in args.report_steps:
                per_family = defaultdict(list)
                for name in first:
                    values = [sizes[(param, w)][metric].get(name, []) for w in config.widths]
                    if name == "lm_head" or any(len(v) < step or v[step - 1] == 0 for v in values):
                        continue  # lm_head: the logits before the logit multiplier; 0: no gradient yet
                    y = np.log([v[step - 1] for v in values])
                    slope = float(np.polyfit(log_widths, y, 1)[0])
                    scales = output_dims[config.widths[-1]][name] != output_dims[config.widths[0]][name]
                    prediction = -1 if metric.startswith("grad") and scales else 0
                    per_family[family(name)].append((slope, name, slope - prediction))
                slopes[step] = {f: max(v, key=lambda s: abs(s[2])) for f, v in per_family.items()}
            last = max((s for s in args.report_steps if slopes[s]), default=None)
            if last is None:
                continue
            worst = sorted(slopes[last], key=lambda f: -abs(slopes[last][f][2]))[: args.rows]
            print(
                "| module (worst layer at the last step) | " + " | ".join(f"step {s}" for s in args.report_steps) + " |"
            )
            print("|---|" + "---|" * len(args.report_steps))
            for f in worst:
                cells = [f"{slopes[s][f][0]:+.2f}" if f in slopes[s] else "–" for s in args.report_steps]
                print(f"| {slopes[last][f][1]} | " + " | ".join(cells) + " |")
            report[param][metric] = {str(s): slopes[s] for s in args.report_steps}
    if args.json:
        saved = sorted(set(range(args.save_first)) | set(range(0, config.steps, args.save_every)))  # step - 1
        with open(args.json, "w") as file:
            json.dump(
                {
                    "settings": config.settings(), "lr": args.lr,
                    "saved_steps": [i + 1 for i in saved],
                    "loss_curves": {f"{p} w{w}": c for (p, w), c in losses.items()},
                    "sizes": {
                        f"{p} w{w}": {m: {n: [float(f"{v[i]:.4g}") for i in saved if i < len(v)] for n, v in by.items()}
                                      for m, by in s.items()}
                        for (p, w), s in sizes.items()
                    },
                    "slopes": report,  # step → module family → (slope, worst layer, slope - muP's prediction)
                },
                file,
            )  # fmt: skip


# each metric's slope against log width under muP: module outputs and the weights' change since init keep their
# size; the loss's gradient with respect to an output shrinks as 1/width where the output's dimension is the width's
PREDICTIONS = {
    "out": "0",
    "out_shared": "0",
    "update": "0",
    "grad": "-1, or 0 for outputs of fixed size (gates, logits)",
    "grad_shared": "-1, or 0 for outputs of fixed size",
}


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
