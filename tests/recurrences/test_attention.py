"""The attention mixer against a plain fp64 softmax reference (explicit q kᵀ, causal mask, softmax, RoPE by complex
rotation), its KV cache, packed documents, and its place beside the recurrence cells (registry, model, training,
engine, parametrizations, stability)."""

from __future__ import annotations

import argparse
import math

import pytest
import torch
import torch.nn.functional as F

import linrnn
from linrnn import parametrizations, stability
from linrnn.recurrences import ROLES
from linrnn.recurrences.base import Documents

HIDDEN, HEADS = 48, 3


def rope_reference(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x ``[B, T, H, D]``: the pair (x_i, x_{i + D/2}) as the complex number x_i + i·x_{i + D/2}, turned by the angle
    position · theta^(−2i/D)."""
    half = x.shape[-1] // 2
    angles = positions[:, None].double() * theta ** (-2 * torch.arange(half, dtype=torch.float64) / x.shape[-1])
    turned = torch.complex(x[..., :half], x[..., half:]) * torch.polar(torch.ones_like(angles), angles)[:, None]
    return torch.cat([turned.real, turned.imag], dim=-1)


def attention_reference(mixer, x: torch.Tensor, positions: torch.Tensor | None = None) -> torch.Tensor:
    """y ``[B, T, hidden]`` of ``mixer`` on x, written out: per head softmax(q kᵀ / √D + causal mask) v."""
    B, T, _ = x.shape
    heads, dim = mixer.num_heads, mixer.head_k_dim
    q, k, v = (F.linear(x, proj.weight).view(B, T, heads, dim) for proj in (mixer.q_proj, mixer.k_proj, mixer.v_proj))
    if mixer.config.use_rope:
        positions = torch.arange(T) if positions is None else positions
        q, k = (rope_reference(h, positions, mixer.config.rope_theta) for h in (q, k))
    scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(dim)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    weights = scores.masked_fill(~causal, float("-inf")).softmax(dim=-1)
    o = torch.einsum("bhts,bshd->bthd", weights, v).reshape(B, T, heads * dim)
    return F.linear(o, mixer.o_proj.weight)


def fp64_mixer(**options):
    torch.manual_seed(0)
    return linrnn.build_mixer("attention", HIDDEN, HEADS, **options).double()


def decode_in_pieces(mixer, x: torch.Tensor, cuts: list[int]) -> torch.Tensor:
    outputs, state = [], None
    for start, end in zip([0, *cuts], [*cuts, x.shape[1]], strict=True):
        y, state = mixer(x[:, start:end], state, output_state=True)
        assert state.position == end and state.kv[0].shape == (x.shape[0], HEADS, end, mixer.head_k_dim)
        outputs.append(y)
    return torch.cat(outputs, dim=1)


@pytest.mark.parametrize("T", [1, 7, 33])
@pytest.mark.parametrize(
    "options", [{}, {"use_rope": False}, {"head_k_dim": 10, "rope_theta": 100.0}],
    ids=["rope", "no_rope", "head_dim_10"],
)  # fmt: skip
def test_forward_and_gradients_match_reference(T, options):
    mixer = fp64_mixer(**options)
    x = torch.randn(2, T, HIDDEN, dtype=torch.float64, requires_grad=True)
    upstream = torch.randn(2, T, HIDDEN, dtype=torch.float64)
    inputs = [x, *mixer.parameters()]
    y, state = mixer(x)
    assert state is None
    expected = attention_reference(mixer, x)
    torch.testing.assert_close(y, expected, rtol=1e-12, atol=1e-12)
    got = torch.autograd.grad(y, inputs, upstream)
    want = torch.autograd.grad(expected, inputs, upstream)
    names = ["x", *(name for name, _ in mixer.named_parameters())]
    for name, g, w in zip(names, got, want, strict=True):
        if T > 1 or name not in ("q_proj.weight", "k_proj.weight"):  # one key: its softmax weight is 1 whatever q, k
            assert g.abs().max() > 1e-3, name
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, msg=lambda m, n=name: f"{n}: {m}")


def test_decode_token_by_token_and_in_pieces_equal_forward():
    mixer = fp64_mixer()
    x = torch.randn(2, 33, HIDDEN, dtype=torch.float64)
    full, _ = mixer(x)
    torch.testing.assert_close(decode_in_pieces(mixer, x, list(range(1, 33))), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(decode_in_pieces(mixer, x, [13]), full, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(decode_in_pieces(mixer, x, [5, 6, 20]), full, rtol=1e-12, atol=1e-12)


def test_model_decodes_with_generate():
    torch.manual_seed(0)
    model = linrnn.build_model("attention", preset="byte-tiny").double()
    ids = torch.randint(0, 256, (2, 17))
    full = model(ids)
    prefill, state = model(ids[:, :6], return_state=True)
    steps = [prefill]
    for t in range(6, 17):
        logits, state = model(ids[:, t : t + 1], state=state, return_state=True)
        steps.append(logits)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-10, atol=1e-10)
    out = linrnn.generate(model, ids[:, :5], max_new_tokens=6, temperature=0)
    assert out.shape == (2, 11)
    assert torch.equal(model(out[:, :-1])[:, 4:].argmax(-1), out[:, 5:])  # each new token is the full forward's argmax


def test_packed_documents_equal_separate_runs():
    torch.manual_seed(0)
    model = linrnn.build_model("attention", preset="byte-tiny").double()
    lengths = [[1, 6, 4, 2], [13], [2, 11]]  # a one-token document, several per row, one per row
    docs = [torch.randint(0, 256, (n,)) for row in lengths for n in row]
    ids = torch.cat(docs).view(len(lengths), -1)
    positions = torch.cat([torch.arange(len(d)) for d in docs]).view_as(ids)
    packed = model(ids, positions=positions)
    packed.square().sum().backward()
    packed_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    separate = [model(doc[None])[0] for doc in docs]
    torch.cat(separate).square().sum().backward()
    torch.testing.assert_close(packed.flatten(0, 1), torch.cat(separate), rtol=1e-10, atol=1e-10)
    for name, p in model.named_parameters():
        torch.testing.assert_close(packed_grads[name], p.grad, rtol=1e-9, atol=1e-10)
    # the mixer alone, on the reference with each document's positions
    mixer = model.layers[0].mixer
    x = torch.randn(1, 13, 64, dtype=torch.float64)
    documents = Documents.from_positions(positions[:1])
    y, _ = mixer(x, documents=documents)
    bounds = [0, 1, 7, 11, 13]
    expected = [attention_reference(mixer, x[:, a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    torch.testing.assert_close(y, torch.cat(expected, dim=1), rtol=1e-12, atol=1e-12)
    # with return_state: each document's cache as one row, zero-padded to the longest ([D, H, 13, K]), lengths
    with torch.no_grad():
        _, state = model(ids, positions=positions, return_state=True)
    keys, values = state[0].kv
    assert state[0].position.tolist() == [len(doc) for doc in docs]
    assert keys.shape[:3] == (len(docs), mixer.num_heads, 13)
    for row, doc in enumerate(docs):
        _, alone = model(doc[None], return_state=True)
        torch.testing.assert_close(keys[row, :, : len(doc)], alone[0].kv[0][0], rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(values[row, :, : len(doc)], alone[0].kv[1][0], rtol=1e-12, atol=1e-12)
        assert not keys[row, :, len(doc) :].any()
    with pytest.raises(ValueError, match="rows of different lengths"):  # padded rows decode only in an engine
        model(ids[:, :1], state=state, return_state=True)


def test_lm_trains():
    torch.manual_seed(0)
    model = linrnn.build_model("attention", preset="byte-tiny")
    text = b"Shall I compare thee to a summer's day? Thou art more lovely and more temperate. " * 2
    data = torch.tensor(list(text))
    ids = torch.stack([data[i : i + 65] for i in (0, 17, 40, 60)])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(12):
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(math.isfinite(loss) for loss in losses)
    assert losses[-1] < 0.6 * losses[0], losses


def test_registry_and_options():
    assert "attention" not in linrnn.list_cells()
    assert linrnn.list_mixers() == [*linrnn.list_cells(), "attention"]
    spec = linrnn.get_cell("attention")
    assert (spec.kind, spec.decay, spec.erase) == ("attention", None, None)
    assert all(linrnn.get_cell(cell).kind == "recurrence" for cell in linrnn.list_cells())
    with pytest.raises(ValueError, match="known cells: deltanet, .*; other mixers: attention"):
        linrnn.get_cell("transformer")
    mixer = linrnn.build_mixer("attention", 64, 4)
    assert (mixer.head_k_dim, mixer.head_v_dim) == (16, 16)
    assert mixer.config.use_rope and not mixer.config.use_short_conv
    assert linrnn.build_mixer("attention", 64, 4, allow_neg_eigval=False, use_short_conv=False) is not None
    with pytest.raises(ValueError, match=r"option 'allow_neg_eigval' does not apply to attention .* got True"):
        linrnn.build_mixer("attention", 64, 4, allow_neg_eigval=True)
    with pytest.raises(ValueError, match=r"option 'use_short_conv' does not apply .* expected it unset or False"):
        linrnn.build_model("attention", use_short_conv=True)
    with pytest.raises(ValueError, match=r"option 'expand_k' does not apply"):
        linrnn.build_mixer("attention", 64, 4, expand_k=1.0)
    assert linrnn.build_mixer("attention", 64, 4, head_k_dim=8).head_v_dim == 8
    with pytest.raises(ValueError, match=r"expected head_v_dim = head_k_dim = 8, got head_v_dim = 16"):
        linrnn.build_mixer("attention", 64, 4, head_k_dim=8, head_v_dim=16)
    # head dim hidden // heads, rounded down to even for RoPE: presets with 6 heads (paper-256: 256 / 6) build
    assert linrnn.build_mixer("attention", 256, 6).head_k_dim == 42
    assert linrnn.build_mixer("attention", 512, 6).head_k_dim == 84  # 85, odd
    assert linrnn.build_mixer("attention", 512, 6, use_rope=False).head_k_dim == 85
    config = linrnn.ModelConfig(cell="attention", vocab_size=10, hidden_size=32, num_layers=1, num_heads=2)
    assert config.cell == "attention"
    with pytest.raises(ValueError, match="in_place=True"):
        mixer(torch.randn(1, 1, 64), linrnn.MixerState(in_place=True))


def test_roles_parametrizations_engine_and_training_names():
    model = linrnn.build_model("attention", preset="byte-tiny", hidden_size=128, intermediate_size=512,
                               tie_embeddings=False)  # fmt: skip
    roles = linrnn.param_roles(model)
    assert set(roles) == {name for name, _ in model.named_parameters()} and set(roles.values()) <= set(ROLES)
    assert {roles[f"layers.1.mixer.{p}_proj.weight"] for p in "qkvo"} == {"hidden"}
    for name in parametrizations.list_parametrizations():
        applied = parametrizations.apply(model, name, base_width=64, optimizer="adamw")
        lr = applied.lr_multipliers()["layers.0.mixer.q_proj.weight"]
        assert lr == (1.0 if name == "sp" else 0.5)  # hidden: η / m_in under muP's AdamW table
        assert model.layers[0].mixer.config.output_multiplier == 1.0  # no output norm for §4.3 to precede
    engine = linrnn.Engine(model, slots=1, max_length=8)  # a KV cache of 8 positions per slot
    assert engine.states[0].kv[0].shape == (1, model.layers[0].mixer.num_heads, 8, model.layers[0].mixer.head_k_dim)
    from linrnn.training import names

    assert names.canonical_config_name("attention_tiny_sp") == "attention_tiny_sp"
    assert names.cells()["attention"] == "attention"


def test_cells_command_marks_attention(capsys):
    from linrnn.cli.listings import cells

    assert cells(argparse.Namespace()) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("│ ")]
    kinds = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in rows if line.split("│")[1].strip()}
    assert kinds == {**dict.fromkeys(linrnn.list_cells(), "recurrence"), "attention": "attention"}


def test_stability_still_checks_every_recurrence():
    cells = stability.stability_cells()
    assert "attention" not in cells and set(linrnn.list_cells()) <= set(cells)
    for cell in cells:
        report = stability.check(cell, draws=32, horizon=4, restarts=1, steps=1)
        assert report.passed or cell == "kda_f", cell
