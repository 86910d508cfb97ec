"""FLA Gated DeltaNet and KDA checkpoints in and out of linrnn (``linrnn.models.fla_checkpoints``).

The tests against FLA's own model need flash-linear-attention (and transformers): they run on the GPU machine, and on
a CPU under the Triton interpreter with Triton < 3.9 (FLA 0.6.0 uses ``tl.make_block_ptr``); elsewhere they skip.
The rest (round trips, refusals) runs everywhere."""

import json
import os
import pickle

import pytest
import torch

import linrnn
from linrnn.errors import UsageError
from linrnn.models.fla_checkpoints import fla_name, from_fla, to_fla

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TINY = dict(vocab_size=97, hidden_size=64, num_layers=2, num_heads=2, intermediate_size=96, head_k_dim=16,
            head_v_dim=32)  # fmt: skip


KDA_FORM = dict(output_gate="sigmoid", output_gate_low_rank=32, gate_low_rank=32)  # FLA's KDA: ranks head_v_dim


def linrnn_gdn(seed: int = 0, cell: str = "gdn", **overrides):
    torch.manual_seed(seed)
    model = linrnn.build_model(cell, **(TINY | (KDA_FORM if cell == "kda" else {}) | overrides))
    away_from_init(model)
    return model


def away_from_init(model):
    """Norm weights away from their ones and biases from their zeros, so that a swapped or lost one shows."""
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            if name.endswith(".bias") and "dt_bias" not in name:
                parameter.uniform_(-0.5, 0.5)


@pytest.mark.parametrize("cell", ["gdn", "kda"])
def test_round_trip_keeps_every_tensor_and_the_logits(tmp_path, cell):
    model = linrnn_gdn(cell=cell, tie_embeddings=False)
    to_fla(model, tmp_path / "fla")
    back = from_fla(tmp_path / "fla")
    assert back.config.model_dump(exclude={"mixer"}) == model.config.model_dump(exclude={"mixer"})
    assert back.layers[0].mixer.config == model.layers[0].mixer.config  # the options in effect
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    ids = torch.randint(0, 97, (2, 19))
    torch.testing.assert_close(back(ids), model(ids), rtol=0, atol=0)


def test_tied_readout_is_written_once_and_stays_tied(tmp_path):
    from safetensors.torch import load_file

    model = linrnn_gdn(tie_embeddings=True)
    to_fla(model, tmp_path)
    stored = load_file(tmp_path / "model.safetensors")
    assert "lm_head.weight" not in stored and "model.embeddings.weight" in stored
    back = from_fla(tmp_path)
    assert back.lm_head.weight is back.embed.weight
    assert torch.equal(back.embed.weight, model.embed.weight)


def test_config_json_describes_the_model_in_fla_terms(tmp_path):
    to_fla(linrnn_gdn(allow_neg_eigval=True, conv_size=3), tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["model_type"] == "gated_deltanet"
    assert (config["num_hidden_layers"], config["num_heads"], config["head_dim"], config["expand_v"]) == (2, 2, 16, 2)
    assert (config["intermediate_size"], config["conv_size"], config["allow_neg_eigval"]) == (96, 3, True)


def test_names_follow_fla():
    assert fla_name("layers.3.mixer.f_proj.weight") == "model.layers.3.attn.a_proj.weight"
    assert fla_name("layers.0.mixer.q_conv.weight") == "model.layers.0.attn.q_conv1d.weight"
    assert fla_name("embed.weight") == "model.embeddings.weight"
    with pytest.raises(KeyError, match="layers.0.mixer.bogus"):
        fla_name("layers.0.mixer.bogus")


def _write(folder, config, weights):
    from safetensors.torch import save_file

    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    save_file(weights, folder / "model.safetensors")


def _fla_folder(tmp_path, model=None):
    to_fla(model or linrnn_gdn(tie_embeddings=False), tmp_path / "ok")
    config = json.loads((tmp_path / "ok" / "config.json").read_text())
    from safetensors.torch import load_file

    return config, load_file(tmp_path / "ok" / "model.safetensors")


@pytest.mark.parametrize(
    "field, value",
    [("attn", {"layers": [1], "num_heads": 2}), ("num_v_heads", 4), ("use_gate", False),
     ("output_gate_activation", "sigmoid"), ("model_type", "gla"), ("attnres_block_size", 2)],
)  # fmt: skip
def test_fla_variants_without_a_linrnn_counterpart_are_refused(tmp_path, field, value):
    config, weights = _fla_folder(tmp_path)
    _write(tmp_path / "bad", config | {field: value}, weights)
    with pytest.raises(UsageError, match=f"{field}.*got {value!r}".replace("[", r"\[").replace("{", r"\{")):
        from_fla(tmp_path / "bad")


@pytest.mark.parametrize("field, value", [("safe_gate", True), ("lower_bound", -5.0)])
def test_kda_bounded_gate_is_refused(tmp_path, field, value):
    to_fla(linrnn_gdn(cell="kda"), tmp_path / "kda")
    config = json.loads((tmp_path / "kda" / "config.json").read_text())
    (tmp_path / "kda" / "config.json").write_text(json.dumps(config | {field: value}))
    with pytest.raises(UsageError, match=f"field '{field}' must be .* for linrnn's kda model, got {value!r}"):
        from_fla(tmp_path / "kda")


def test_wrong_or_missing_tensors_are_named(tmp_path):
    config, weights = _fla_folder(tmp_path)
    missing = dict(weights)
    del missing["model.layers.1.attn.dt_bias"]
    _write(tmp_path / "missing", config, missing | {"model.layers.1.attn.extra": torch.zeros(2)})
    with pytest.raises(UsageError, match=r"unexpected model\.layers\.1\.attn\.extra, missing model\.layers\.1\.attn"):
        from_fla(tmp_path / "missing")
    reshaped = dict(weights)
    reshaped["model.layers.0.attn.o_norm.weight"] = torch.ones(31)
    _write(tmp_path / "shape", config, reshaped)
    with pytest.raises(UsageError, match=r"o_norm.weight' must have shape \[32\], got \[31\]"):
        from_fla(tmp_path / "shape")


def test_sharded_weights_are_read_through_their_index(tmp_path):
    from safetensors.torch import save_file

    model = linrnn_gdn(cell="kda", tie_embeddings=False)
    config, weights = _fla_folder(tmp_path, model)
    names = sorted(weights)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    (tmp_path / "sharded").mkdir()
    (tmp_path / "sharded" / "config.json").write_text(json.dumps(config))
    for shard, held in shards.items():
        save_file({name: weights[name] for name in held}, tmp_path / "sharded" / shard)
    weight_map = {name: shard for shard, held in shards.items() for name in held}
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    back = from_fla(tmp_path / "sharded")
    for name, tensor in model.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    shard = tmp_path / "sharded" / "model-00002-of-00002.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    with pytest.raises(UsageError, match="model-00002-of-00002.safetensors is not a readable safetensors file"):
        from_fla(tmp_path / "sharded")
    shard.unlink()
    with pytest.raises(UsageError, match="names shard 'model-00002-of-00002.safetensors', which is not in the folder"):
        from_fla(tmp_path / "sharded")
    (tmp_path / "sharded" / "model.safetensors.index.json").write_text("[]")
    with pytest.raises(UsageError, match="must hold a 'weight_map' object"):
        from_fla(tmp_path / "sharded")
    (tmp_path / "sharded" / "config.json").write_text("{not json")
    with pytest.raises(UsageError, match="config.json is not JSON"):
        from_fla(tmp_path / "sharded")


class _CreatesFile:
    """Unpickling this creates a file: the proof that a pickle was loaded."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_pickled_weights_are_refused_unread(tmp_path):
    config, _ = _fla_folder(tmp_path)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "config.json").write_text(json.dumps(config))
    marker = tmp_path / "unpickled"
    (tmp_path / "bin" / "pytorch_model.bin").write_bytes(pickle.dumps(_CreatesFile(marker)))
    with pytest.raises(UsageError, match="does not unpickle"):
        from_fla(tmp_path / "bin")
    assert not marker.exists()
    with pytest.raises(UsageError, match="expected a folder with config.json"):
        from_fla(tmp_path / "nothing")


def test_to_fla_refuses_what_fla_cannot_hold_and_does_not_overwrite(tmp_path):
    with pytest.raises(UsageError, match="mixer.use_rope = False, got True"):
        to_fla(linrnn_gdn(use_rope=True), tmp_path / "rope")
    with pytest.raises(UsageError, match="cell = 'gated_deltanet' or 'kda', got 'gla'"):
        to_fla(linrnn.build_model("gla"), tmp_path / "gla")
    with pytest.raises(UsageError, match="KDAForCausalLM needs model config mixer.output_gate = 'sigmoid', got 'silu'"):
        to_fla(linrnn.build_model("kda"), tmp_path / "kda")
    to_fla(linrnn_gdn(), tmp_path / "once")
    before = (tmp_path / "once" / "model.safetensors").read_bytes()
    with pytest.raises(UsageError, match=r"already holds \['config.json', 'model.safetensors'\]"):
        to_fla(linrnn_gdn(seed=1), tmp_path / "once")
    assert (tmp_path / "once" / "model.safetensors").read_bytes() == before


# Against FLA's own model


@pytest.fixture
def fla_models():
    models = pytest.importorskip("fla.models")
    if DEVICE == "cpu":
        import triton

        if os.environ.get("TRITON_INTERPRET") != "1" or tuple(map(int, triton.__version__.split(".")[:2])) >= (3, 9):
            pytest.skip("FLA 0.6.0 on the CPU needs the Triton interpreter with Triton < 3.9")
        import triton.runtime.autotuner as autotuner

        # the interpreter has no benchmarker: autotuned FLA kernels take their first config
        autotuner.Autotuner._bench = lambda self, *args, config, **kwargs: [0.0, 0.0, 0.0]
    return models


def skip_where_fla_cannot_run(length: int) -> None:
    if DEVICE == "cpu" and length > 64:  # FLA's chunk kernels call .to() on a loop index, a Python int there
        pytest.skip("FLA 0.6.0's chunked path (T > 64) does not run under the Triton interpreter")


FLA_CLASSES = {"gdn": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM"), "kda": ("KDAConfig", "KDAForCausalLM")}


def fla_model(models, cell: str, tie: bool):
    torch.manual_seed(1)
    config_class, model_class = (getattr(models, name) for name in FLA_CLASSES[cell])
    config = config_class(hidden_size=64, num_hidden_layers=2, num_heads=2, head_dim=16, expand_v=2.0,
                          intermediate_size=96, vocab_size=97, tie_word_embeddings=tie,
                          fuse_cross_entropy=False)  # fmt: skip
    model = model_class(config)
    away_from_init(model)
    return model.to(DEVICE).eval()


def check_logits(folder, linrnn_model, fla_model, ids):
    """linrnn's and FLA's logits against the definition: the same weights in fp64 through the torch recurrence.
    linrnn's fp32 model is within 1e-5 of it (1.1e-6 at most measured on an H100); so is FLA's fused recurrent path
    (T <= 64; 2.2e-6). FLA's chunked path rounds its fp32 inputs to tf32 (10-bit mantissa) in its matrix products:
    GDN 2.7e-4 to 8.0e-4 at logits up to 1.6, KDA 9.4e-4 to 1.4e-3 (up to 2.0e-3 of the largest logit) at logits up
    to 1.4 (experiments/fla_precision_probe.py), hence its own bound there, relative to the largest logit."""
    reference = from_fla(folder, backend="torch").double().eval()(ids.cpu())
    with torch.no_grad():
        actual, expected = linrnn_model(ids).double().cpu(), fla_model(input_ids=ids).logits.double().cpu()
    torch.testing.assert_close(actual, reference, rtol=0, atol=1e-5)
    fla_atol = 1e-5 if ids.shape[1] <= 64 else 5e-3 * reference.abs().max().item()
    torch.testing.assert_close(expected, reference, rtol=0, atol=fla_atol)


@pytest.mark.parametrize("length", [40, 100], ids=["recurrent", "chunked"])  # FLA: fused recurrent at T <= 64
@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
@pytest.mark.parametrize("cell", ["gdn", "kda"])
def test_fla_checkpoint_gives_fla_logits(tmp_path, fla_models, cell, tie, length):
    skip_where_fla_cannot_run(length)
    fla = fla_model(fla_models, cell, tie)
    fla.save_pretrained(tmp_path, safe_serialization=True)
    ids = torch.randint(0, 97, (2, length), device=DEVICE)
    for model in (from_fla(tmp_path), from_fla(fla)):
        check_logits(tmp_path, model.to(DEVICE).eval(), fla, ids)


@pytest.mark.parametrize("length", [40, 100], ids=["recurrent", "chunked"])
@pytest.mark.parametrize("cell", ["gdn", "kda"])
def test_linrnn_model_written_for_fla_gives_its_logits(tmp_path, fla_models, cell, length):
    skip_where_fla_cannot_run(length)
    model = linrnn_gdn(cell=cell, tie_embeddings=True, allow_neg_eigval=True).to(DEVICE).eval()
    to_fla(model, tmp_path)
    fla = getattr(fla_models, FLA_CLASSES[cell][1]).from_pretrained(tmp_path).to(DEVICE).eval()
    assert fla.config.allow_neg_eigval
    check_logits(tmp_path, model, fla, torch.randint(0, 97, (2, length), device=DEVICE))
