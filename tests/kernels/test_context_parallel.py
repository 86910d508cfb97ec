"""Context parallelism (linrnn.kernels.context_parallel): a model whose rows are split along time over 2 and 3 gloo
processes gives, in fp64, the loss and every parameter gradient of the unsplit rows in one process, for every
recurrent cell, with documents that start inside a slice and documents that cross slices."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import linrnn
from linrnn.kernels.context_parallel import VALUE_SIDE
from linrnn.training.model import check_context_parallel

RECURRENT = [cell for cell in linrnn.list_cells() if cell != "attention"]
ROWS, LENGTH = 2, 30


def batch(seed: int):
    """(input ids, targets, positions) ``[ROWS, LENGTH]``: row 0 has documents starting at 0, 11 and 13 (one that
    crosses every slice boundary of 2 and 3 ranks, one of two tokens), row 1 at 0 and 22."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (ROWS, LENGTH), generator=generator)
    targets = torch.randint(0, 256, (ROWS, LENGTH), generator=generator)
    positions = torch.arange(LENGTH).repeat(ROWS, 1)
    for row, start in ((0, 11), (0, 13), (1, 22)):
        positions[row, start:] = torch.arange(LENGTH - start)
    return ids, targets, positions


def split_run(rank: int, ranks: int, folder: str) -> None:
    """One process of ``ranks``: for each cell, the summed loss and gradients of its slice, summed over ranks."""
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=ranks)
    piece = slice(rank * LENGTH // ranks, (rank + 1) * LENGTH // ranks)
    out = {}
    for i, cell in enumerate(RECURRENT):
        torch.manual_seed(i)
        model = linrnn.build_model(cell, preset="byte-tiny", num_layers=2).double()
        model.context_group = dist.group.WORLD
        ids, targets, positions = batch(seed=i)
        loss = model.loss(ids[:, piece], targets[:, piece], positions=positions[:, piece], reduction="sum")
        loss.backward()
        summed = {"loss": loss.detach(), **{name: p.grad for name, p in model.named_parameters()}}
        for x in summed.values():
            dist.all_reduce(x)
        out[cell] = summed
    if rank == 0:
        torch.save(out, f"{folder}/split.pt")
    dist.destroy_process_group()


def whole_run(cell: str, seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=2).double()
    ids, targets, positions = batch(seed)
    loss = model.loss(ids, targets, positions=positions, reduction="sum")
    loss.backward()
    return {"loss": loss.detach(), **{name: p.grad for name, p in model.named_parameters()}}


@pytest.mark.parametrize("ranks", [3])  # the middle rank both receives and passes on
def test_split_rows_give_the_whole_rows_loss_and_gradients(ranks, tmp_path):
    mp.start_processes(split_run, args=(ranks, str(tmp_path)), nprocs=ranks, start_method="spawn")
    split = torch.load(tmp_path / "split.pt", weights_only=True)
    for i, cell in enumerate(RECURRENT):
        expected = whole_run(cell, seed=i)
        assert split[cell].keys() == expected.keys()
        for name, wanted in expected.items():
            error = ((split[cell][name] - wanted).norm() / wanted.norm().clamp_min(1e-300)).item()
            assert error < 1e-10, f"{cell}, {ranks} ranks, {name}: relative error {error:.2e}"


def test_value_side_gates_are_the_write_gate():
    assert VALUE_SIDE == ("w",)


def test_the_run_is_checked_before_training():
    from types import SimpleNamespace

    plain = SimpleNamespace(context_parallel_load_balancer=None)
    model = linrnn.build_model("gdn", preset="byte-tiny")  # short conv of 4 taps: slices of at least 3 tokens
    check_context_parallel(model, 2, 64, plain)
    with pytest.raises(ValueError, match=r"seq_len \(63\) must be a multiple of .*context_parallel_degree \(2\)"):
        check_context_parallel(model, 2, 63, plain)
    with pytest.raises(ValueError, match="slices of at least 3 tokens"):
        check_context_parallel(model, 32, 64, plain)
    with pytest.raises(ValueError, match="context_parallel_load_balancer must be None .* got 'headtail'"):
        check_context_parallel(model, 2, 64, SimpleNamespace(context_parallel_load_balancer="headtail"))
    hybrid = linrnn.build_model("gdn", preset="byte-tiny", layer_pattern=["gdn", "attention"])
    with pytest.raises(ValueError, match=r"softmax attention layers \(layers \[1\]\)"):
        check_context_parallel(hybrid, 2, 64, plain)


def test_a_group_of_one_is_the_plain_forward_compiled_or_not_and_keeps_no_state():
    """One process as a group of one: the split path (eager and inside compiled blocks) gives the plain forward;
    a decoding state belongs to whole rows, so a split model refuses to return one."""
    store = torch.distributed.HashStore()
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        model = linrnn.build_model("gdn", preset="byte-tiny", num_layers=1)
        model.context_group = dist.group.WORLD
        ids, _, positions = batch(0)
        with pytest.raises(ValueError, match="state cannot be returned"):
            model(ids, positions=positions, return_state=True)
        with pytest.raises(ValueError, match="context parallelism needs 'positions'"):
            model(ids)
        one = model(ids, positions=positions)  # a group of one: the plain forward
        for layer in model.layers:
            layer.compile(backend="aot_eager")  # as torchtitan compiles blocks: the split parts run eagerly inside
        torch.testing.assert_close(model(ids, positions=positions), one, rtol=1e-6, atol=1e-6)
        model.context_group = None
        torch.testing.assert_close(one, model(ids, positions=positions), rtol=1e-6, atol=1e-6)
    finally:
        dist.destroy_process_group()
