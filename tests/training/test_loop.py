"""The one training loop (``linrnn.training.loop.train_steps``) that the sweep, the demo and the coordinate check
share: the loss falls, every step reaches the callback, the schedule sets each group's learning rate, clipping
bounds the update, and bad arguments are named."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import linrnn
from linrnn import parametrizations
from linrnn.errors import UsageError
from linrnn.training.loop import Step, parametrized_optimizer, train_steps


def regression() -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """A linear model and one fixed batch: inputs [16, 4], targets [16, 1]."""
    torch.manual_seed(0)
    inputs = torch.randn(16, 4)
    return nn.Linear(4, 1), (inputs, inputs.sum(-1, keepdim=True))


def squared_error(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inputs, targets = batch
    return (model(inputs) - targets).pow(2).mean()


def test_a_tiny_language_model_learns():
    """The default loss (``model.loss`` on (inputs, targets)) on one batch of bytes, under muP's param groups."""
    torch.manual_seed(0)
    model = linrnn.build_model("gdn", hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                               tie_embeddings=False)  # fmt: skip
    applied = parametrizations.apply(model, "mup", base_width=16, optimizer="adamw")
    optimizer = parametrized_optimizer(applied, 1e-2)
    assert sorted(group["lr"] for group in optimizer.param_groups) == [5e-3, 1e-2]  # hidden: lr × 16/32
    data = torch.randint(0, 256, (4, 17))  # [B, T + 1]
    losses = train_steps(model, optimizer, itertools.repeat((data[:, :-1], data[:, 1:])), 6)
    assert len(losses) == 6 and all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < losses[0] - 0.5
    assert all(later < earlier for earlier, later in itertools.pairwise(losses))


def test_the_callbacks_see_every_step():
    model, batch = regression()
    seen: list[Step] = []
    gradients: list[int] = []

    def on_gradients(step: int) -> None:
        assert all(parameter.grad is not None for parameter in model.parameters())
        gradients.append(step)

    losses = train_steps(model, torch.optim.SGD(model.parameters(), lr=0.05), itertools.repeat(batch), 5,
                         loss=squared_error, on_gradients=on_gradients, on_step=seen.append)  # fmt: skip
    assert [done.step for done in seen] == gradients == [1, 2, 3, 4, 5]
    assert [done.loss.item() for done in seen] == losses
    assert all(done.grad_norm is None and done.lrs == (0.05,) for done in seen)  # no clipping, no schedule
    assert losses[-1] < losses[0]
    assert all(parameter.grad is None for parameter in model.parameters())  # zeroed after every step

    stopped = train_steps(model, torch.optim.SGD(model.parameters(), lr=0.05), itertools.repeat(batch), 5,
                          loss=squared_error, on_step=lambda done: done.step == 2)  # fmt: skip
    assert len(stopped) == 2
    assert train_steps(model, torch.optim.SGD(model.parameters(), lr=0.05), [], 0, loss=squared_error) == []


def test_the_schedule_sets_every_groups_learning_rate():
    model, batch = regression()
    groups = [{"params": [model.weight], "lr": 0.1}, {"params": [model.bias], "lr": 0.02}]

    def factor(step: int) -> float:  # warmup over 2 steps, then halving
        return step / 2 if step <= 2 else 0.5 ** (step - 2)

    seen: list[Step] = []
    train_steps(model, torch.optim.SGD(groups), itertools.repeat(batch), 5, loss=squared_error, schedule=factor,
                on_step=seen.append)  # fmt: skip
    for done in seen:
        assert done.lrs == pytest.approx((0.1 * factor(done.step), 0.02 * factor(done.step)), rel=1e-12)

    # a scheduler object is stepped after each optimizer step: StepLR halves the rate every 2 steps
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    seen.clear()
    train_steps(model, optimizer, itertools.repeat(batch), 5, loss=squared_error, schedule=schedule,
                on_step=seen.append)  # fmt: skip
    assert [done.lrs for done in seen] == [(0.1,), (0.1,), (0.05,), (0.05,), (0.025,)]


@pytest.mark.parametrize("max_norm", [None, 1e-3, 1e3])
def test_clipping_bounds_the_update(max_norm):
    """Plain SGD moves the parameters by lr × gradient: by lr × max_norm when the gradient norm exceeds it."""
    model, batch = regression()
    before = [parameter.detach().clone() for parameter in model.parameters()]
    norms: list[torch.Tensor] = []  # before clipping

    def gradient_norm(step: int) -> None:
        norms.append(torch.nn.utils.get_total_norm([parameter.grad for parameter in model.parameters()]))

    seen: list[Step] = []
    train_steps(model, torch.optim.SGD(model.parameters(), lr=0.5), [batch], 1, loss=squared_error,
                max_norm=max_norm, on_gradients=gradient_norm, on_step=seen.append)  # fmt: skip
    moved = torch.nn.utils.get_total_norm([new - old for new, old in zip(model.parameters(), before, strict=True)])
    (norm,) = norms
    assert float(norm) > 1e-2  # the small bound clips
    expected = 0.5 * (float(norm) if max_norm is None else min(float(norm), max_norm))
    assert float(moved) == pytest.approx(expected, rel=1e-5)
    if max_norm is None:
        assert seen[0].grad_norm is None
    else:
        assert float(seen[0].grad_norm) == float(norm)  # what clip_grad_norm_ returns: the norm before clipping


def test_autocast_wraps_the_loss():
    model, batch = regression()
    enabled: list[bool] = []

    def loss(model: nn.Module, batch) -> torch.Tensor:
        enabled.append(torch.is_autocast_enabled("cpu"))
        return squared_error(model, batch).float()

    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    train_steps(model, optimizer, itertools.repeat(batch), 1, loss=loss, autocast=torch.bfloat16)
    train_steps(model, optimizer, itertools.repeat(batch), 1, loss=loss)
    assert enabled == [True, False]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"steps": -1}, ["argument 'steps'", "integer >= 0", "got -1"]),
        ({"steps": 2.0}, ["argument 'steps'", "got 2.0"]),
        ({"steps": True}, ["argument 'steps'", "got True"]),
        ({"max_norm": 0.0}, ["argument 'max_norm'", "finite number > 0", "got 0.0"]),
        ({"max_norm": math.nan}, ["argument 'max_norm'", "got nan"]),
        ({"optimizer": "adamw"}, ["argument 'optimizer'", "torch.optim.Optimizer", "got str"]),
        ({"model": "gdn"}, ["argument 'model'", "torch.nn.Module", "got str"]),
        ({"batches": 7}, ["argument 'batches'", "iterable of batches", "got int"]),
        ({"batches": []}, ["argument 'batches' ran out after 0 batches", "steps = 2"]),
        ({"loss": "mse"}, ["argument 'loss'", "loss(model, batch)", "got str"]),
        ({"loss": lambda model, batch: model(batch[0])}, ["argument 'loss'", "scalar tensor", "shape [16, 1]"]),
        ({"schedule": 0.5}, ["argument 'schedule'", "step()", "got float"]),
        ({"autocast": torch.float32}, ["argument 'autocast'", "torch.bfloat16", "got torch.float32"]),
        ({"on_step": 1}, ["argument 'on_step'", "None or a function", "got int"]),
        ({"on_gradients": "x"}, ["argument 'on_gradients'", "got str"]),
    ],
)
def test_bad_arguments_are_named(change, named):
    model, batch = regression()
    arguments = dict(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                     batches=itertools.repeat(batch), steps=2, loss=squared_error)  # fmt: skip
    with pytest.raises(UsageError) as caught:
        train_steps(**{**arguments, **change})
    message = str(caught.value)
    assert message.startswith("train_steps: ")
    for text in named:
        assert text in message, message
