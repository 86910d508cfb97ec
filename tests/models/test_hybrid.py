"""Hybrid models: a layer pattern cycled over the layers (three Gated DeltaNet layers to one attention layer)."""

from __future__ import annotations

import pytest
import torch

import linrnn
from linrnn import parametrizations
from linrnn.inference import Sampling, decode_one
from linrnn.models import load_checkpoint, save_checkpoint

PATTERN = ["gdn", "gdn", "gdn", "attention"]


def hybrid(**overrides):
    torch.manual_seed(0)
    return linrnn.build_model("gdn", num_layers=5, layer_pattern=PATTERN, **overrides)


def test_layers_follow_the_pattern_and_options_reach_the_layers_that_have_them():
    model = hybrid(conv_size=3, use_rope=True)
    assert [layer.mixer.cell for layer in model.layers] == ["gated_deltanet"] * 3 + ["attention", "gated_deltanet"]
    assert model.layers[0].mixer.config.conv_size == 3  # attention has no short conv: the option skips it
    roles = linrnn.param_roles(model)
    assert roles["layers.3.mixer.q_proj.weight"] == "hidden" and roles["layers.0.mixer.A_log"] == "gate_scalar"
    with pytest.raises(ValueError, match="unknown cell 'gdm'"):
        linrnn.build_model("gdn", layer_pattern=["gdm"])
    with pytest.raises(ValueError, match="layer_pattern must name at least one mixer"):
        linrnn.build_model("gdn", layer_pattern=[])


def test_decoding_token_by_token_is_the_forward_argmax():
    model = hybrid().double().eval()
    prompt = torch.randint(0, 256, (9,), generator=torch.Generator().manual_seed(1))
    request = decode_one(model, prompt, Sampling(temperature=0, max_new_tokens=12))
    tokens = torch.cat([prompt, torch.tensor(request.tokens)])
    with torch.no_grad():
        logits = model(tokens[None, :-1])[0]
    assert request.tokens == logits[len(prompt) - 1 :].argmax(-1).tolist()


def test_checkpoint_and_parametrization_keep_the_pattern(tmp_path):
    model = hybrid()
    applied = parametrizations.apply(model, "gdn-mup", base_width=32)
    assert applied.param_groups(lr=1e-3)
    assert model.layers[3].mixer.__class__.__name__ == "Attention"
    save_checkpoint(model, tmp_path / "model.pt")
    loaded = load_checkpoint(tmp_path / "model.pt")
    assert loaded.config.layer_pattern == ["gated_deltanet"] * 3 + ["attention"]
    ids = torch.randint(0, 256, (2, 17))
    torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    assert linrnn.Engine(model, slots=2, max_length=16).max_length == 16  # attention layers: a KV cache per slot
