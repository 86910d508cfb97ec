"""The coordinate check (Tensor Programs V's verification of muP): train a few steps on fixed data at several
widths and record the mean absolute coordinate of every module's output, and of the GDN-muP paper's probes, per step.

Under a parametrization that is right for the model, every size is flat in width at every step (slope of log
size against log width near 0); under SP with a width-independent learning rate, activations fed by updated
hidden matrices grow with width. Besides each output's size, ``Δ name`` records the size of its change since
step 0. Sizes are averaged over several inits (``seeds``), as the mup package does: with two heads a gate
pre-activation has two coordinates per token, and one draw's sampling noise alone moves a slope by ±0.2.

Probes, per mixer, each scaled by the width dependence the GDN-muP paper predicts for it, so that flat means as
predicted: ``q_hat_sqrt_d`` (the L2-normalised query × √d_k, §4.1), ``state_sqrt_d`` (the final recurrent state
× √d_k, §4.2), ``o`` (the recurrence output entering the gated RMSNorm, after the pre-norm multiplier, §4.3),
``beta`` and ``decay`` (exp g). The readout is tracked as the logits after the logit multiplier (``logits``),
not as ``lm_head``'s raw output.

The model is the ``byte-tiny`` preset (byte vocabulary, 2 layers, 2 heads unless ``num_heads``) at hidden size =
width, MLP 4 × width, with an untied readout that starts at zero (Tensor Programs V's choice: a random readout's
logits vanish at init as m^(-1/2) under muP, by design, and would show that instead of the dynamics). The gate
scalars (A_log, dt_bias) of layer i are drawn from the same seed at every width, since with two heads their
random draws otherwise dominate the decay's differences between widths. The data are the demo's sonnet windows.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from linrnn.errors import UsageError
from linrnn.parametrizations import apply, get
from linrnn.recurrences.base import LinearRNNMixer, mamba_decay_params
from linrnn.text import text_bytes
from linrnn.training.loop import parametrized_optimizer, train_steps

DEFAULT_LR = {"adamw": 1e-3, "sgd": 0.1}  # the coordinate checks' learning rates (docs/parametrizations.md)


@dataclass
class CoordCheck:
    cell: str
    parametrization: str
    optimizer: str
    lr: float
    widths: list[int]
    steps: int
    sizes: dict[str, np.ndarray] = field(default_factory=dict)  # name → [steps + 1, widths] mean |coordinate|

    def slopes(self) -> dict[str, np.ndarray]:
        """name → [steps + 1] slope of log size against log width (least squares), per step (0 = at init; NaN
        for the changes since init, ``Δ name``, which start at step 1)."""
        x = np.log(np.asarray(self.widths, dtype=float))
        slopes = {}
        for name, size in self.sizes.items():
            first = 1 if name.startswith("Δ ") else 0
            fitted = np.polyfit(x, np.log(np.maximum(size[first:], 1e-30)).T, 1)[0]
            slopes[name] = np.concatenate([np.full(first, np.nan), fitted])
        return slopes

    def worst_slope(self, steps: range | None = None, changes: bool = False) -> tuple[str, int, float]:
        """(name, step, slope) with the largest |slope| over ``steps`` (default: 0 … steps), among the sizes
        (``changes=True``: among the changes since init, ``Δ name``)."""
        steps = range(self.steps + 1) if steps is None else steps
        best = ("", 0, 0.0)
        for name, slope in self.slopes().items():
            if name.startswith("Δ ") != changes:
                continue
            for t in steps:
                if abs(slope[t]) > abs(best[2]):  # NaN compares False
                    best = (name, t, float(slope[t]))
        return best

    def plot(self, path) -> None:
        """One panel per step: size against width (log-log) per tracked output, like the GDN-muP paper's appendix."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        figure, axes = plt.subplots(1, self.steps + 1, figsize=(4 * (self.steps + 1), 4), sharey=True)
        # one colour and one legend entry per kind of output (its name without layer index and Δ), every layer in
        # it; changes since step 0 (Δ) dashed
        kinds = {name: ".".join(part for part in name.removeprefix("Δ ").split(".") if not part.isdigit()
                                and part != "layers") or "block" for name in self.sizes}  # fmt: skip
        palette = [*plt.get_cmap("tab20").colors, *plt.get_cmap("tab20b").colors]
        colour = {kind: palette[i % len(palette)] for i, kind in enumerate(dict.fromkeys(kinds.values()))}
        for t, axis in enumerate(np.atleast_1d(axes)):
            labelled = set()
            for name, size in self.sizes.items():
                kind, change = kinds[name], name.startswith("Δ ")
                label = kind if t == 0 and kind not in labelled else None
                labelled.add(kind)
                axis.plot(self.widths, size[t], marker=".", lw=1, alpha=0.7, color=colour[kind],
                          linestyle="--" if change else "-", label=label)  # fmt: skip
            axis.set_xscale("log", base=2)
            axis.set_yscale("log")
            axis.set_xlabel("width")
            axis.set_title(f"step {t}" + (" (init)" if t == 0 else ""))
            axis.grid(True, alpha=0.3)
        np.atleast_1d(axes)[0].set_ylabel("mean |coordinate|")
        figure.suptitle(f"coordinate check: {self.cell}, {self.parametrization}, {self.optimizer}, lr {self.lr:g}")
        figure.tight_layout()
        handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
        handles += [plt.Line2D([], [], color="grey", linestyle=style) for style in ("-", "--")]
        labels += ["(solid: size)", "(dashed: Δ since step 0)"]
        figure.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5),
                      ncol=1 + len(labels) // 32, title="output, all layers", title_fontsize=7)  # fmt: skip
        figure.savefig(path, dpi=110, bbox_inches="tight")  # the legend outside the panels, kept whole
        plt.close(figure)


def coord_check(
    cell: str,
    parametrization: str,
    *,
    widths=(64, 128, 256, 512),
    base_width: int = 64,
    optimizer: str = "adamw",
    lr: float | None = None,
    steps: int = 3,
    batch: int = 8,
    seq_len: int = 64,
    seeds=(0,),
    num_heads: int = 2,
    pre_norm_multiplier: bool | None = None,
    readout_zero_init: bool = True,
    on_step: Callable[[], None] | None = None,
) -> CoordCheck:
    """Runs the check (module docstring) and returns the sizes, averaged over ``seeds`` (each seed draws its own
    init); ``lr`` defaults to 1e-3 (AdamW), 0.1 (SGD). The readout is untied, and zero at init unless
    ``readout_zero_init=False`` (then its logits vanish at init as m^(-1/2), muP's design)."""
    if len(set(widths)) < 2:
        raise UsageError(f"coord_check: argument 'widths' must hold at least two distinct widths (slopes are "
                         f"fitted against width), got {list(widths)}")  # fmt: skip
    if optimizer not in DEFAULT_LR:
        raise UsageError(f"coord_check: argument 'optimizer' must be 'adamw' or 'sgd', got {optimizer!r}")
    parametrization = get(parametrization).name  # canonical (aliases such as gdnmup resolve)
    lr = DEFAULT_LR[optimizer] if lr is None else lr
    data = text_bytes()
    if len(data) < batch * seq_len + 1:
        raise UsageError(f"coord_check: batch × seq_len = {batch * seq_len} exceeds the {len(data) - 1} bytes of text")
    windows = data[: batch * seq_len + 1]
    inputs, targets = windows[:-1].view(batch, seq_len), windows[1:].view(batch, seq_len)
    seeds = tuple(seeds)
    if not seeds:
        raise UsageError("coord_check: argument 'seeds' must name at least one seed, got ()")
    result = CoordCheck(cell, parametrization, optimizer, lr, list(widths), steps)
    for seed in seeds:
        for column, width in enumerate(widths):
            torch.manual_seed(seed)
            model = _model(cell, width, num_heads)
            applied = apply(
                model,
                parametrization,
                base_width=base_width,
                optimizer=optimizer,
                pre_norm_multiplier=pre_norm_multiplier,
                readout_zero_init=readout_zero_init,
            )
            _same_gate_scalars(model, seed)
            torch_optimizer = parametrized_optimizer(applied, lr)  # the per-role lrs, no weight decay
            for t, sizes in enumerate(_sizes_per_step(model, torch_optimizer, inputs, targets, steps, on_step)):
                for name, size in sizes.items():
                    total = result.sizes.setdefault(name, np.zeros((steps + 1, len(widths))))
                    total[t, column] += size / len(seeds)
    return result


def _model(cell: str, width: int, num_heads: int) -> nn.Module:
    """The checked model at ``width``: byte-tiny, MLP 4 × width, untied readout."""
    import linrnn

    return linrnn.build_model(cell, preset="byte-tiny", hidden_size=width, intermediate_size=4 * width,
                              num_heads=num_heads, tie_embeddings=False)  # fmt: skip


@torch.no_grad()
def _same_gate_scalars(model: nn.Module, seed: int) -> None:
    """A_log and dt_bias of layer i drawn from seed + i (per-channel dt_bias: the first entries agree)."""
    for i, layer in enumerate(model.layers):
        mixer = layer.mixer
        if hasattr(mixer, "A_log"):
            torch.manual_seed(seed + 1000 + i)
            a_log, dt_bias = mamba_decay_params(mixer.A_log.numel(), mixer.dt_bias.numel())
            mixer.A_log.copy_(a_log)
            mixer.dt_bias.copy_(dt_bias)


def _sizes_per_step(model: nn.Module, optimizer: torch.optim.Optimizer, inputs: Tensor, targets: Tensor, steps: int,
                    on_step: Callable[[], None] | None) -> list[dict[str, float]]:  # fmt: skip
    """{name: mean |coordinate|} of the forward at each step 0 … steps: the forwards of ``steps`` training steps on
    the one batch (``linrnn.training.loop.train_steps``), then one more after the last update. Forward hooks record
    every module's output and, at the end of each forward, the mixers' probes."""
    mixers = {name: module for name, module in model.named_modules() if isinstance(module, LinearRNNMixer)}
    sizes: dict[str, float] = {}  # the current forward's
    at_init: dict[str, Tensor] = {}  # each output at step 0, for the change since init
    per_step: list[dict[str, float]] = []

    def record(name: str):
        def hook(module, args, output):
            tensor = output[0] if isinstance(output, tuple) else output
            if isinstance(tensor, Tensor) and tensor.is_floating_point():
                tensor = tensor.detach()
                sizes[name] = float(tensor.abs().mean())
                if name not in at_init:
                    at_init[name] = tensor.clone()
                else:
                    sizes[f"Δ {name}"] = float((tensor - at_init[name]).abs().mean())

        return hook

    def start_probes(module, args):
        sizes.clear()
        for mixer in mixers.values():
            mixer.probes = {}

    def read_probes(module, args, output):  # the model's last forward hook: after every output's
        for name, mixer in mixers.items():
            sizes.update({f"{name}:{key}": value for key, value in _probe_sizes(mixer).items()})
            mixer.probes = None
        per_step.append(dict(sizes))  # here rather than after the step: a recomputing backward fires the hooks again

    handles = [
        model.register_forward_pre_hook(start_probes),
        *(
            module.register_forward_hook(record(name or "logits"))
            for name, module in model.named_modules()
            if name != "lm_head" and not isinstance(module, (nn.ModuleList, nn.Sequential))
        ),
        model.register_forward_hook(read_probes),
    ]
    try:
        train_steps(model, optimizer, itertools.repeat((inputs, targets)), steps, loss=_logits_loss,
                    on_step=None if on_step is None else lambda done: on_step())  # fmt: skip
        model(inputs)  # the sizes after the last update
    finally:
        for handle in handles:
            handle.remove()
        for mixer in mixers.values():
            mixer.probes = None
    return per_step


def _logits_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """Cross-entropy through the model's forward (whose hooks record the sizes), not ``model.loss``."""
    inputs, targets = batch
    return F.cross_entropy(model(inputs).flatten(0, 1), targets.flatten())


def _probe_sizes(mixer: LinearRNNMixer) -> dict[str, float]:
    probes = mixer.probes
    root_d = math.sqrt(mixer.head_k_dim)
    out = {
        "q_hat_sqrt_d": float(probes["q"].detach().abs().mean()) * root_d,
        "state_sqrt_d": float(probes["state"].detach().abs().mean()) * root_d,
        "o": float(probes["o"].detach().abs().mean()),
    }
    if "beta" in probes:
        out["beta"] = float(probes["beta"].detach().abs().mean())
    if "g" in probes:
        out["decay"] = float(probes["g"].detach().exp().mean())
    return out
