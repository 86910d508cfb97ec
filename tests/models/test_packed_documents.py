"""Packed documents (``model(ids, positions=...)``): each document's logits and every parameter's gradient equal
running that document alone, in fp64, for every cell and both CPU backends, with short convs and RoPE."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import linrnn
from tests.helpers import CELLS

LENGTHS = [[1, 6, 4, 2], [13], [2, 11]]  # three rows of 13: a one-token document, several per row, one per row


def packed_batch(seed: int):
    gen = torch.Generator().manual_seed(seed)
    docs = [torch.randint(0, 256, (n,), generator=gen) for row in LENGTHS for n in row]
    ids = torch.cat(docs).view(len(LENGTHS), -1)
    positions = torch.cat([torch.arange(len(d)) for d in docs]).view_as(ids)
    return docs, ids, positions


def gradients(model):
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("backend", ["reference", "torch"])
@pytest.mark.parametrize("cell", CELLS)
def test_packed_equals_separate_documents(cell, backend):
    torch.manual_seed(0)
    chunked = {"chunk_size": 4} if backend == "torch" else {}  # the reference is sequential: it refuses a chunk size
    model = linrnn.build_model(cell, use_rope=True, backend=backend, **chunked).double()
    docs, ids, positions = packed_batch(seed=1)
    targets = torch.randint(0, 256, ids.shape, generator=torch.Generator().manual_seed(2))

    logits = model(ids, positions=positions)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="sum").backward()
    packed = gradients(model)
    model.zero_grad()

    separate, start = [], 0
    flat_targets = targets.flatten()
    for doc in docs:
        doc_logits = model(doc[None])[0]
        F.cross_entropy(doc_logits, flat_targets[start : start + len(doc)], reduction="sum").backward()
        separate.append(doc_logits)
        start += len(doc)
    torch.testing.assert_close(logits.flatten(0, 1), torch.cat(separate), rtol=1e-10, atol=1e-10)
    for name, grad in gradients(model).items():
        torch.testing.assert_close(packed[name], grad, rtol=1e-9, atol=1e-10, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("cell", CELLS)
def test_packed_documents_under_bf16_autocast(cell):
    """The short conv's crossing-tap correction keeps autocast's dtype (it raised a dtype mismatch in bf16)."""
    torch.manual_seed(0)
    model = linrnn.build_model(cell, backend="torch", chunk_size=4)
    _, ids, positions = packed_batch(seed=1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(ids, positions=positions)
    logits.float().sum().backward()
    reference = model(ids, positions=positions)
    assert torch.isfinite(logits.float()).all()
    assert (logits.float() - reference).abs().max() < 0.05 * reference.abs().max()


@pytest.mark.gpu
@pytest.mark.parametrize("cell", CELLS)
def test_bf16_autocast_on_the_triton_kernels(cell):
    """Under CUDA autocast the norms give fp32 q, k and the projections bf16 v; the mixer runs the kernels in
    v's dtype (they refused mixed dtypes), forward and backward, packed or not."""
    torch.manual_seed(0)
    model = linrnn.build_model(cell, backend="auto").cuda()
    _, ids, positions = packed_batch(seed=1)
    ids, positions = ids.cuda(), positions.cuda()
    reference = model(ids, positions=positions)
    for at in (positions, None):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(ids, positions=at)
        logits.float().sum().backward()
        assert torch.isfinite(logits.float()).all()
        assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    assert (logits.float() - model(ids)).abs().max() < 0.05 * reference.abs().max()


def test_positions_that_never_restart_equal_the_plain_forward():
    torch.manual_seed(0)
    model = linrnn.build_model("gdn").double()
    ids = torch.randint(0, 256, (2, 9))
    positions = torch.arange(9).expand(2, 9)
    torch.testing.assert_close(model(ids, positions=positions), model(ids), rtol=1e-12, atol=1e-12)


def test_document_boundaries_and_offsets():
    """Boundaries come to the host once; each token's offset is its index within its document."""
    from linrnn.recurrences.base import Documents

    _, _, positions = packed_batch(0)
    documents = Documents.from_positions(positions)
    lengths = [n for row in LENGTHS for n in row]
    assert documents.cu_seqlens.device.type == "cpu"
    assert documents.cu_seqlens.tolist() == [0, *torch.tensor(lengths).cumsum(0).tolist()]
    assert documents.offset.tolist() == [i for n in lengths for i in range(n)]


def test_bad_positions():
    model = linrnn.build_model("gdn")
    ids = torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"'positions' must be an integer tensor of input_ids' shape \[2, 5\]"):
        model(ids, positions=torch.zeros(2, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="'positions' must be an integer tensor"):
        model(ids, positions=torch.zeros(2, 5))
    _, state = model(ids, positions=torch.zeros(2, 5, dtype=torch.long), return_state=True)
    with pytest.raises(ValueError, match="cannot be combined"):
        model(ids, positions=torch.zeros(2, 5, dtype=torch.long), state=state)


@pytest.mark.parametrize("cell, options", [("gated_deltanet", {"use_rope": True}), ("gammanet", {"conv_size": 3})])
def test_packed_documents_return_each_documents_state(cell, options):
    """With ``return_state``, packed documents (one shorter than the conv's history) give, row by row, the state each
    one reaches alone: recurrent state, short-conv histories and position (fp64)."""
    torch.manual_seed(0)
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=2, **options).double()
    lengths = [5, 1, 9]
    ids = torch.randint(0, 256, (1, sum(lengths)))
    positions = torch.cat([torch.arange(n) for n in lengths])[None]
    with torch.no_grad():
        _, packed = model(ids, positions=positions, return_state=True)
        alone = [model(part, return_state=True)[1] for part in ids.split(lengths, dim=1)]
    for layer, packed_layer in enumerate(packed):
        assert packed_layer.position.tolist() == lengths
        for row, document in enumerate(alone):
            expected = document[layer]
            torch.testing.assert_close(packed_layer.recurrent[row], expected.recurrent[0], rtol=1e-10, atol=1e-12)
            assert packed_layer.conv.keys() == expected.conv.keys()
            for name, history in expected.conv.items():
                torch.testing.assert_close(packed_layer.conv[name][row], history[0], rtol=1e-10, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.parametrize("cell", CELLS)
def test_packed_documents_on_the_triton_kernels(cell):
    """The model's varlen path on the GPU kernels (fp32) against the fp64 reference: logits and gradients."""
    torch.manual_seed(0)
    reference = linrnn.build_model(cell, backend="reference").double().cuda()
    fast = linrnn.build_model(cell, backend="triton").cuda()
    fast.load_state_dict(reference.state_dict())
    _, ids, positions = packed_batch(seed=3)
    ids, positions = ids.cuda(), positions.cuda()
    outputs = []
    for model in (reference, fast):
        logits = model(ids, positions=positions).double()
        logits.square().mean().backward()
        outputs.append((logits, {n: p.grad.double() for n, p in model.named_parameters()}))
    (ref_logits, ref_grads), (logits, grads) = outputs
    assert torch.linalg.norm(logits - ref_logits) <= 1e-4 * torch.linalg.norm(ref_logits)
    for name, grad in ref_grads.items():
        assert torch.linalg.norm(grads[name] - grad) <= 1e-4 * torch.linalg.norm(grad) + 1e-9, name


def test_checkpointed_activations_give_the_same_gradients():
    torch.manual_seed(0)
    plain = linrnn.build_model("gammanet").double()
    recomputed = linrnn.build_model("gammanet", checkpoint_activations=True).double()
    recomputed.load_state_dict(plain.state_dict())
    _, ids, positions = packed_batch(seed=4)
    for model in (plain, recomputed):
        model(ids, positions=positions).square().mean().backward()
    for (name, a), b in zip(plain.named_parameters(), recomputed.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-12, atol=1e-14, msg=name)
