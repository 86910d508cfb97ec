import pytest
import torch

import linrnn
from linrnn.models import LanguageModel, model_config

CELLS = linrnn.list_cells()


def decode_one_by_one(model, ids, state=None):
    logits = []
    for t in range(ids.shape[1]):
        step, state = model(ids[:, t : t + 1], state=state, return_state=True)
        logits.append(step)
    return torch.cat(logits, dim=1), state


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"use_rope": True, "allow_neg_eigval": True},
        {"use_short_conv": False},
        {"output_gate": "sigmoid", "output_gate_low_rank": 8},
    ],
    ids=["default", "rope_negeig", "no_conv", "low_rank_sigmoid_gate"],
)
@pytest.mark.parametrize("cell", CELLS)
def test_decode_equals_full_forward(cell, options):
    torch.manual_seed(0)
    model = linrnn.build_model(cell, preset="byte-tiny", **options).double()
    ids = torch.randint(0, 256, (2, 23))
    full = model(ids)
    stepped, _ = decode_one_by_one(model, ids)
    torch.testing.assert_close(stepped, full, rtol=1e-10, atol=1e-10)
    # prefill a prompt, then decode the rest
    prefill, state = model(ids[:, :9], return_state=True)
    rest, _ = decode_one_by_one(model, ids[:, 9:], state)
    torch.testing.assert_close(torch.cat([prefill, rest], dim=1), full, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("cell", CELLS)
def test_forward_backward_roles(cell):
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=3)
    ids = torch.randint(0, 256, (2, 17))
    loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    assert torch.isfinite(loss)
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
    roles = linrnn.param_roles(model)
    assert set(roles) == {name for name, _ in model.named_parameters()}
    assert roles["embed.weight"] == "embedding" and "lm_head.weight" not in roles  # tied
    assert roles["layers.2.mixer.q_proj.weight"] == "hidden" and roles["layers.0.mlp_norm.weight"] == "norm"
    untied = linrnn.build_model(cell, tie_embeddings=False)
    assert linrnn.param_roles(untied)["lm_head.weight"] == "readout"


def test_generate():
    torch.manual_seed(0)
    model = linrnn.build_model("gdn")
    prompt = torch.randint(0, 256, (3, 5))
    greedy = linrnn.generate(model, prompt, 7, temperature=0)
    assert greedy.shape == (3, 12) and torch.equal(greedy[:, :5], prompt)
    assert torch.equal(linrnn.generate(model, prompt, 7, top_k=1), greedy)
    # greedy tokens are the argmax of the full forward on the generated sequence
    logits = model(greedy[:, :-1])
    assert torch.equal(logits[:, 4:].argmax(-1), greedy[:, 5:])
    sampled = linrnn.generate(model, prompt[0], 4, temperature=1.0, top_k=5, generator=torch.Generator().manual_seed(1))
    assert sampled.shape == (9,)
    with pytest.raises(ValueError, match="'max_new_tokens' must be an int >= 0, got -1"):
        linrnn.generate(model, prompt, -1)
    with pytest.raises(ValueError, match="'top_k' must be None or an int >= 1, got 0"):
        linrnn.generate(model, prompt, 2, top_k=0)


def test_presets_and_overrides():
    assert linrnn.list_presets()[0] == "byte-tiny" and "paper-1536" in linrnn.list_presets()
    config = model_config("gdn", "paper-512", hidden_size=640, use_rope=True)
    assert config.cell == "gated_deltanet" and config.hidden_size == 640 and config.num_layers == 8
    assert config.mixer == {"use_rope": True} and config.intermediate_size == 4 * 512
    with torch.device("meta"):
        wide = LanguageModel(model_config("gdn", "paper-1536"))
    # the GDN-muP paper's family: widths up to ~342M non-embedding parameters
    assert 330e6 < wide.num_parameters(exclude_embeddings=True) < 350e6
    with pytest.raises(ValueError, match="argument 'preset': expected one of byte-tiny, tiny, .*, got 'huge'"):
        linrnn.build_model("gdn", preset="huge")
    with pytest.raises(ValueError, match="unknown model option 'depth'; known options: .*num_layers"):
        linrnn.build_model("gdn", depth=3)
    with pytest.raises(ValueError, match="unknown cell 'gpt'"):
        linrnn.build_model("gpt")
    with pytest.raises(ValueError, match="vocab_size"):
        linrnn.build_model("gdn", vocab_size=0)


def test_bad_model_inputs():
    model = linrnn.build_model("kda")
    with pytest.raises(
        ValueError, match=r"'input_ids' must be an integer tensor \[B, T\], got torch.float32 tensor of shape \[4\]"
    ):
        model(torch.zeros(4))
    with pytest.raises(ValueError, match="'state' must hold 2 layer states, got 1"):
        model(torch.zeros(1, 3, dtype=torch.long), state=[None])


def test_bf16_model_runs():
    model = linrnn.build_model("gammanet").to(torch.bfloat16)
    ids = torch.randint(0, 256, (2, 40))
    logits = model(ids)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits).all()
    reference = linrnn.build_model("gammanet", backend="reference").to(torch.bfloat16)
    reference.load_state_dict(model.state_dict())
    torch.testing.assert_close(logits.float(), reference(ids).float(), rtol=0.05, atol=0.05)


@pytest.mark.parametrize("cell", CELLS)
def test_one_projection_gemm_equals_the_modules(cell):
    """``project``'s single GEMM over the concatenated weights gives each module's output, the streams' block
    (their outputs side by side) and each weight's gradient (fp64); a bias on a first layer is carried too."""
    torch.manual_seed(2)
    mixer = linrnn.build_model(cell, preset="byte-tiny", num_layers=1).double().layers[0].mixer
    first = next(iter(mixer.input_projections().values()))
    first.bias = torch.nn.Parameter(torch.randn(first.out_features, dtype=torch.float64))
    x = torch.randn(2, 7, mixer.config.hidden_size, dtype=torch.float64)
    fused = mixer.project(x)
    separate = {name: module(x) for name, module in mixer.input_projections().items()}
    separate["streams"] = torch.cat([separate[name] for name in mixer.stream_names], dim=-1)
    assert fused.keys() == separate.keys() and len(fused) >= 6
    assert_same_outputs_and_weight_grads(mixer, fused, separate)


def assert_same_outputs_and_weight_grads(mixer, fused: dict, separate: dict) -> None:
    """Equal outputs (fp64) and equal gradients of every mixer weight under one random cotangent per output."""
    weights = [p for p in mixer.parameters() if p.requires_grad]
    cotangent = {name: torch.randn_like(y) for name, y in fused.items()}
    grads = [torch.autograd.grad([(ys[n] * cotangent[n]).sum() for n in fused], weights, allow_unused=True)
             for ys in (fused, separate)]  # fmt: skip
    for name in fused:
        torch.testing.assert_close(fused[name], separate[name], rtol=1e-12, atol=1e-12)
    for fused_grad, separate_grad in zip(*grads, strict=True):
        assert (fused_grad is None) == (separate_grad is None)
        if fused_grad is not None:
            torch.testing.assert_close(fused_grad, separate_grad, rtol=1e-12, atol=1e-12)


def test_inference_projection_weight_follows_the_parameters():
    """Without autograd ``project`` keeps its concatenated weight between calls; an optimizer-style in-place
    update or ``load_state_dict`` must still be seen, and a training forward frees the copy."""
    torch.manual_seed(3)
    mixer = linrnn.build_model("gated_deltanet", preset="byte-tiny", num_layers=1).double().layers[0].mixer
    x = torch.randn(1, 5, mixer.config.hidden_size, dtype=torch.float64)

    def separate():
        return {name: module(x) for name, module in mixer.input_projections().items()}

    def streams_block(projected):
        return torch.cat([projected[name] for name in mixer.stream_names], dim=-1)

    with torch.no_grad():
        first = mixer.project(x)
        assert set(mixer._inference_cache) == {"projection"}
        mixer.k_proj.weight.mul_(-0.5)  # what optimizer.step does
        second = mixer.project(x)
        torch.testing.assert_close(second["k"], separate()["k"], rtol=1e-12, atol=1e-12)
        assert not torch.allclose(first["k"], second["k"])
        state = {n: torch.randn_like(p) for n, p in mixer.state_dict().items()}
        mixer.load_state_dict(state)
        projected = mixer.project(x)
        assert projected.keys() == {*separate(), "streams"}
        torch.testing.assert_close(projected.pop("streams"), streams_block(separate()), rtol=1e-12, atol=1e-12)
        for name, y in projected.items():
            torch.testing.assert_close(y, separate()[name], rtol=1e-12, atol=1e-12)
    mixer.project(x)
    assert not mixer._inference_cache


@pytest.mark.parametrize("cell", CELLS)
def test_one_short_conv_equals_the_stream_modules(cell):
    """``short_convs`` over the streams' block with the weights side by side equals each stream's ``ShortConv`` on
    its own (the probed path): outputs, the history, the packed-document form and every gradient (fp64)."""
    from linrnn.recurrences.base import Documents

    torch.manual_seed(4)
    mixer = linrnn.build_model(cell, preset="byte-tiny", num_layers=1).double().layers[0].mixer
    x = torch.randn(1, 9, mixer.config.hidden_size, dtype=torch.float64)
    width = sum(getattr(mixer, f"{name}_conv").weight.shape[0] for name in mixer.stream_names)
    history = torch.randn(1, width, mixer.config.conv_size - 1, dtype=torch.float64)
    documents = Documents.from_positions(torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]]))
    for args in [(history, None), (None, documents)]:
        fused, fused_history = mixer.short_convs(mixer.project(x), *args, in_place=False)
        streams = {k: v for k, v in mixer.project(x).items() if k != "streams"}  # as probed: stream by stream
        separate, separate_history = mixer.short_convs(streams, *args, in_place=False)
        assert fused.keys() == separate.keys() == set(mixer.stream_names)
        if args[1] is None:
            torch.testing.assert_close(fused_history, separate_history, rtol=1e-12, atol=1e-12)
        else:
            assert fused_history is None and separate_history is None
        assert_same_outputs_and_weight_grads(mixer, fused, separate)


def test_conv_init():
    """'normal' (the default): every short-conv weight ~ N(0, init_std²) like the projections (FLA's init);
    'uniform': Conv1d's U(±1/√conv_size). Both draw afresh at each build."""

    def conv_weights(model):
        return torch.cat([p.flatten() for name, p in model.named_parameters() if "_conv." in name])

    torch.manual_seed(0)
    normal = conv_weights(linrnn.build_model("gdn", hidden_size=128, init_std=0.05))
    assert abs(normal.std().item() - 0.05) < 0.005 and abs(normal.mean().item()) < 0.005
    torch.manual_seed(0)
    uniform = conv_weights(linrnn.build_model("gdn", hidden_size=128, conv_init="uniform"))
    bound = 1 / 4**0.5  # conv_size 4
    assert uniform.abs().max() <= bound and uniform.abs().max() > 0.95 * bound
    assert abs(uniform.std().item() - bound / 3**0.5) < 0.02
