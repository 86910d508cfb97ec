"""The training loop of the library's short runs: ``linrnn sweep``'s grid points, ``linrnn demo`` and the
coordinate check (``linrnn train`` runs torchtitan's ``Trainer`` instead).

One step, for step = 1 … steps::

    batch = next(batches)
    loss = loss_fn(model, batch)             # under autocast when asked
    loss.backward()
    on_gradients(step)                       # the gradients in place, before clipping
    grad_norm = clip_grad_norm_(max_norm)    # when max_norm is given: the global norm before clipping
    optimizer.step(); schedule.step(); optimizer.zero_grad()
    on_step(Step(step, loss, grad_norm, lrs))  # True stops the loop after this step

Nothing in the loop reads the device before the end (the losses stay tensors until one read returns them as
floats), so a GPU run is not synchronised once a step. The callers differ only in what they pass: the sweep a
torchtitan optimizer container, its warmup + cosine schedule, clipping, bf16 autocast on CUDA, packed-document
batches and a recorder of gradient norms that stops a diverged run; the demo a plain AdamW on random windows; the
coordinate check the parametrization's torch optimizer (``parametrized_optimizer``) on one fixed batch, with forward
hooks that record activation sizes.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from numbers import Real
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from linrnn.errors import UsageError

if TYPE_CHECKING:
    from linrnn.parametrizations import Applied

AUTOCAST_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class Step:
    """What one step did, as ``on_step`` sees it."""

    step: int  # 1 … steps
    loss: Tensor  # [] detached, on the model's device (reading it waits for the device)
    grad_norm: Tensor | None  # [] the global gradient norm before clipping; None without max_norm
    lrs: tuple[float, ...]  # the learning rate of every param group during this step


def next_token_loss(model: nn.Module, batch: tuple[Tensor, Tensor]) -> Tensor:
    """The default loss: ``batch`` is (inputs, targets), each [B, T]; ``model.loss`` (a ``LanguageModel``'s
    cross-entropy without the [B, T, vocab] logits)."""
    inputs, targets = batch
    return model.loss(inputs, targets)


def train_steps(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Iterable,
    steps: int,
    *,
    loss: Callable[[nn.Module, Any], Tensor] = next_token_loss,
    schedule: Any = None,
    max_norm: float | None = None,
    autocast: torch.dtype | None = None,
    on_gradients: Callable[[int], None] | None = None,
    on_step: Callable[[Step], bool | None] | None = None,
) -> list[float]:
    """Trains ``model`` for ``steps`` steps (module docstring) and returns the loss of each step run (fewer than
    ``steps`` when ``on_step`` stopped the loop).

    ``optimizer``: a torch optimizer over the model's parameters (or torchtitan's ``OptimizersContainer``).
    ``batches``: an iterable with at least ``steps`` batches, each passed to ``loss(model, batch)``, which returns
    a scalar tensor (default: ``next_token_loss``). ``schedule``: None (a constant learning rate), a scheduler
    with ``step()`` (torch's ``LRScheduler``, torchtitan's ``LRSchedulersContainer``), stepped after each
    optimizer step, or a function ``factor(step)`` that multiplies each group's initial learning rate during
    step 1 … steps. ``max_norm``: clip the global gradient norm to it (None: no clipping). ``autocast``: run the
    loss under ``torch.autocast`` in this dtype (bf16, fp16) on the model's device type (None: no autocast).
    """
    batches = _check_arguments(model, optimizer, batches, steps, loss, schedule, max_norm, autocast,
                               on_gradients, on_step)  # fmt: skip
    if steps == 0:
        return []
    if schedule is not None and not hasattr(schedule, "step"):
        factor = schedule  # LambdaLR applies factor(index) during step index + 1
        schedule = _Schedulers(
            [torch.optim.lr_scheduler.LambdaLR(part, lambda index: factor(index + 1)) for part in _parts(optimizer)]
        )
    precision = contextlib.nullcontext() if autocast is None else torch.autocast(_device_type(model), dtype=autocast)
    losses: list[Tensor] = []  # [] each, on the device until the end
    model.train()
    for step in range(1, steps + 1):
        try:
            batch = next(batches)
        except StopIteration:
            raise UsageError(f"train_steps: argument 'batches' ran out after {step - 1} batches, expected at least "
                             f"steps = {steps}") from None  # fmt: skip
        with precision:
            step_loss = loss(model, batch)
        if not isinstance(step_loss, Tensor) or step_loss.dim() != 0:
            got = f"shape {list(step_loss.shape)}" if isinstance(step_loss, Tensor) else type(step_loss).__name__
            raise UsageError(f"train_steps: argument 'loss' must return a scalar tensor, got {got}")
        step_loss.backward()
        if on_gradients is not None:
            on_gradients(step)
        grad_norm = None
        if max_norm is not None:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm, foreach=True)
        optimizer.step()
        lrs = tuple(group["lr"] for part in _parts(optimizer) for group in part.param_groups)  # before the schedule
        if schedule is not None:
            schedule.step()
        optimizer.zero_grad()
        losses.append(step_loss.detach())
        if on_step is not None and on_step(Step(step, losses[-1], grad_norm, lrs)):
            break
    return [float(value) for value in torch.stack(losses).float().cpu()]  # the one read of the device


def parametrized_optimizer(applied: Applied, lr: float, weight_decay: float = 0.0, **options) -> torch.optim.Optimizer:
    """torch's AdamW or SGD, whichever the model was parametrized for, over ``applied.param_groups(lr,
    weight_decay)``: each role's learning rate is ``lr`` × its multiplier. ``options``: the optimizer's own
    (``betas``, ``momentum``, ``nesterov``, ...)."""
    factory = torch.optim.AdamW if applied.optimizer == "adamw" else torch.optim.SGD
    return factory(applied.param_groups(lr, weight_decay), weight_decay=weight_decay, **options)


def _check_arguments(model, optimizer, batches, steps, loss, schedule, max_norm, autocast, on_gradients, on_step):
    """Each argument of ``train_steps`` against what it expects (one message naming it); returns the batch
    iterator."""

    def bad(name: str, expected: str, got: object) -> UsageError:
        return UsageError(f"train_steps: argument '{name}' must be {expected}, got {got}")

    if not isinstance(model, nn.Module):
        raise bad("model", "a torch.nn.Module", type(model).__name__)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise bad("optimizer", "a torch.optim.Optimizer", type(optimizer).__name__)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
        raise bad("steps", "an integer >= 0", repr(steps))
    if not callable(loss):
        raise bad("loss", "a function loss(model, batch) -> scalar tensor", type(loss).__name__)
    if schedule is not None and not (hasattr(schedule, "step") or callable(schedule)):
        raise bad("schedule", "None, a scheduler with step() or a function factor(step)", type(schedule).__name__)
    valid_norm = isinstance(max_norm, Real) and not isinstance(max_norm, bool) and math.isfinite(max_norm)
    if max_norm is not None and not (valid_norm and max_norm > 0):
        raise bad("max_norm", "None or a finite number > 0", repr(max_norm))
    if autocast is not None and autocast not in AUTOCAST_DTYPES:
        raise bad("autocast", "None, torch.bfloat16 or torch.float16", repr(autocast))
    for name, callback in (("on_gradients", on_gradients), ("on_step", on_step)):
        if callback is not None and not callable(callback):
            raise bad(name, "None or a function", type(callback).__name__)
    try:
        return iter(batches)
    except TypeError:
        raise bad("batches", "an iterable of batches", type(batches).__name__) from None


def _parts(optimizer: torch.optim.Optimizer) -> list[torch.optim.Optimizer]:
    """The optimizers holding the param groups: torchtitan's container keeps them in ``optimizers``."""
    return list(getattr(optimizer, "optimizers", [optimizer]))


def _device_type(model: nn.Module) -> str:
    parameter = next(model.parameters(), None)
    return "cpu" if parameter is None else parameter.device.type


class _Schedulers:
    """Several schedulers stepped as one (one per optimizer of a container)."""

    def __init__(self, schedulers: list):
        self.schedulers = schedulers

    def step(self) -> None:
        for scheduler in self.schedulers:
            scheduler.step()
