"""Hugging Face folders (``LanguageModel.save_pretrained`` / ``from_pretrained``), linrnn in transformers' Auto classes
(``linrnn.models.hf``), ``linrnn export`` and torchtitan's state-dict adapter."""

import json
import pickle
import sys

import pytest
import torch

import linrnn
from linrnn.cli import main
from linrnn.errors import UsageError
from linrnn.models import LanguageModel
from linrnn.models import hf as linrnn_hf

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast  # noqa: E402

HYBRID = "gdn+attention"
MODELS = [*linrnn.list_cells(), HYBRID]
PROMPT_LEN, NEW_TOKENS = 6, 5


def build(name: str, **overrides) -> LanguageModel:
    """A tiny model of a cell (or the hybrid) with weights large enough that greedy decoding does not repeat one
    token."""
    torch.manual_seed(0)
    if name == HYBRID:
        overrides["layer_pattern"] = ["gdn", "attention"]
        name = "gdn"
    return linrnn.build_model(name, preset="byte-tiny", num_layers=2, hidden_size=32, init_std=0.3, **overrides).eval()


def one_line_error(raised) -> str:
    message = str(raised.value)
    assert "\n" not in message
    return message


def prompt(batch: int = 2) -> torch.Tensor:
    return torch.randint(0, 256, (batch, PROMPT_LEN), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", MODELS)
def test_auto_model_loads_the_folder(name, tmp_path):
    """save_pretrained → AutoModelForCausalLM and LanguageModel.from_pretrained: the same logits in fp32 and the same
    greedy tokens through transformers' generate and linrnn's."""
    model = build(name)
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["linrnn"] == model.config.model_dump(mode="json")
    ids = prompt()
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(hf_model, linrnn_hf.LinrnnForCausalLM)
    with torch.no_grad():
        expected = model(ids)
        torch.testing.assert_close(hf_model(ids).logits, expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(LanguageModel.from_pretrained(tmp_path)(ids), expected, rtol=0, atol=0)
    generated = hf_model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)
    reference = linrnn.generate(model, ids, NEW_TOKENS, temperature=0)
    assert generated.tolist() == reference.tolist()
    assert len(set(generated[:, PROMPT_LEN:].flatten().tolist())) > 1  # a test that can fail


def test_transformers_save_pretrained_round_trip(tmp_path):
    """LinrnnForCausalLM.save_pretrained (transformers' writer) gives a folder LanguageModel.from_pretrained reads, with
    an untied readout and its bias; config.json keeps the whole ModelConfig and the linrnn version."""
    model = build(HYBRID, tie_embeddings=False, readout_bias=True)
    with torch.no_grad():
        model.logit_bias.normal_()
    model.save_pretrained(tmp_path / "ours")
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "ours")
    hf_model.save_pretrained(tmp_path / "theirs")
    config = json.loads((tmp_path / "theirs" / "config.json").read_text())
    assert config["model_type"] == "linrnn" and config["linrnn"] == model.config.model_dump(mode="json")
    assert config["linrnn_version"] == LanguageModel.hf_config_fields(model.config)["linrnn_version"]
    ids = prompt()
    with torch.no_grad():
        torch.testing.assert_close(hf_model(ids).logits, model(ids), rtol=0, atol=1e-5)
        torch.testing.assert_close(LanguageModel.from_pretrained(tmp_path / "theirs")(ids), model(ids), rtol=0, atol=0)


def test_labels_give_the_models_loss(tmp_path):
    model = build("gdn")
    model.save_pretrained(tmp_path)
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = prompt()
    labels = ids.clone()
    labels[0, 2] = -100
    with torch.no_grad():
        loss = hf_model(ids, labels=labels).loss
        torch.testing.assert_close(loss, model.loss(ids[:, :-1], labels[:, 1:]), rtol=0, atol=1e-5)


def test_generate_carries_the_state(tmp_path):
    """Beam search (the cache's rows reordered) and sampling give what recomputing the whole sequence at each step
    gives (use_cache=False), on the hybrid (recurrent state and attention keys and values)."""
    build(HYBRID).save_pretrained(tmp_path)
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = prompt()
    for options in ({"num_beams": 3, "do_sample": False}, {"do_sample": True, "top_k": 5}):
        runs = []
        for use_cache in (True, False):
            torch.manual_seed(0)
            runs.append(hf_model.generate(ids, max_new_tokens=NEW_TOKENS, use_cache=use_cache, **options).tolist())
        assert runs[0] == runs[1], options


def test_attention_mask_and_position_ids(tmp_path):
    """Right padding is taken without a carried state; other padding is an error, not ignored. position_ids are
    packed documents."""
    model = build("gdn")
    model.save_pretrained(tmp_path)
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    ids = prompt()
    mask = torch.ones_like(ids)
    mask[1, -2:] = 0
    with torch.no_grad():
        padded = hf_model(ids, attention_mask=mask).logits
        torch.testing.assert_close(padded[1, :-2], model(ids[1:, :-2])[0], rtol=0, atol=1e-5)
        with pytest.raises(ValueError, match="attention_mask.*left or inside") as raised:
            hf_model(ids, attention_mask=mask.flip(1))
        one_line_error(raised)
        with pytest.raises(ValueError, match="attention_mask.*carried recurrent state"):
            hf_model.generate(ids, attention_mask=mask.flip(1), max_new_tokens=2, do_sample=False)
        packed = hf_model(ids[:1], position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]])).logits[0]
        torch.testing.assert_close(packed, torch.cat([model(ids[:1, :3]), model(ids[:1, 3:])], dim=1)[0], rtol=0,
                                   atol=1e-5)  # fmt: skip


def pickled_folder(folder, monkeypatch):
    """``folder`` with a linrnn config.json and pickled weights; unpickling fails the test from now on."""
    build("gdn").save_pretrained(folder)
    (folder / "model.safetensors").unlink()
    (folder / "pytorch_model.bin").write_bytes(pickle.dumps({"model.embed.weight": torch.zeros(1)}))

    def forbidden(*args, **kwargs):
        raise AssertionError("a pickle was read")

    for module, name in ((torch, "load"), (pickle, "load"), (pickle, "loads"), (pickle, "Unpickler")):
        monkeypatch.setattr(module, name, forbidden)
    return folder


def test_pickled_weights_are_refused_unread(tmp_path, monkeypatch):
    folder = pickled_folder(tmp_path / "pickled", monkeypatch)
    for load in (LanguageModel.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(UsageError, match="pytorch_model.bin") as raised:
            load(folder)
        assert "never" in one_line_error(raised)
    with pytest.raises(UsageError, match="use_safetensors"):
        linrnn_hf.LinrnnForCausalLM.from_pretrained(tmp_path, use_safetensors=False)


def test_a_pickle_beside_safetensors_is_never_opened(tmp_path, monkeypatch):
    build("gdn").save_pretrained(tmp_path)
    pickled_folder(tmp_path / "unused", monkeypatch)
    (tmp_path / "training_args.bin").write_bytes(b"not read")
    assert isinstance(LanguageModel.from_pretrained(tmp_path), LanguageModel)
    assert isinstance(AutoModelForCausalLM.from_pretrained(tmp_path), linrnn_hf.LinrnnForCausalLM)


def test_another_model_type_is_refused(tmp_path):
    build("gdn").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "llama"}))
    for load in (LanguageModel.from_pretrained, linrnn_hf.LinrnnForCausalLM.from_pretrained):
        with pytest.raises(UsageError, match="expected model_type 'linrnn', got 'llama'") as raised:
            load(tmp_path)
        one_line_error(raised)


def test_bad_folders_and_weights(tmp_path):
    with pytest.raises(UsageError, match="argument 'folder'.*no such folder"):
        LanguageModel.from_pretrained(tmp_path / "missing")
    build("gdn").save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["linrnn"]["num_layers"] = 3
    (tmp_path / "config.json").write_text(json.dumps(config))
    for load in (LanguageModel.from_pretrained, AutoModelForCausalLM.from_pretrained):
        with pytest.raises(UsageError, match="do not fit its config") as raised:
            load(tmp_path)
        one_line_error(raised)


def test_tokenizer_files(tmp_path):
    """A tokenizers.Tokenizer or a transformers tokenizer goes into the folder, which AutoTokenizer reads; config.json
    names its BOS and EOS; a tokenizer larger than the model is refused before anything is written."""
    from tests.evaluation.run_folders import train_tokenizer

    tokenizer_folder = train_tokenizer(tmp_path / "tokenizer")
    model = build("gdn", vocab_size=300)
    from tokenizers import Tokenizer

    model.save_pretrained(tmp_path / "a", tokenizer=Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json")))
    hf_tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(tokenizer_folder / "tokenizer.json"), bos_token="<s>",
                                           eos_token="</s>")  # fmt: skip
    model.save_pretrained(tmp_path / "b", tokenizer=hf_tokenizer)
    text = "Shall I compare thee"
    expected = Tokenizer.from_file(str(tokenizer_folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    for folder in (tmp_path / "a", tmp_path / "b"):
        assert AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False) == expected
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    assert (config["bos_token_id"], config["eos_token_id"]) == (0, 1)
    with pytest.raises(UsageError, match="argument 'tokenizer'.*vocab_size = 256 tokens, got 300"):
        build("gdn").save_pretrained(tmp_path / "c", tokenizer=tokenizer_folder)
    assert not (tmp_path / "c").exists()
    with pytest.raises(UsageError, match="argument 'tokenizer'.*got int"):
        model.save_pretrained(tmp_path / "c", tokenizer=3)


def test_export_a_run_folder(tmp_path, capsys):
    from tests.evaluation.run_folders import make_run_folder, small_model, train_tokenizer

    tokenizer = train_tokenizer(tmp_path / "tokenizer")
    model = small_model(300)
    run = make_run_folder(tmp_path / "run", model, tokenizer)
    out = tmp_path / "hf"
    assert main(["export", str(run), str(out)]) == 0
    assert str(out) in capsys.readouterr().out
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        path.name for path in out.iterdir()
    }
    ids = torch.tensor([[0, 5, 17, 42]])
    with torch.no_grad():
        torch.testing.assert_close(AutoModelForCausalLM.from_pretrained(out)(ids).logits, model(ids), rtol=0, atol=1e-5)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "</s>" and tokenizer("Shall I")["input_ids"][0] == tokenizer.bos_token_id == 0

    def error(argv):
        assert main(argv) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("linrnn export: ")
        return lines[0]

    capsys.readouterr()  # transformers' progress bars
    before = (out / "model.safetensors").read_bytes()
    line = error(["export", str(run), str(out)])
    assert "argument OUT" in line and "nothing is overwritten" in line
    assert (out / "model.safetensors").read_bytes() == before
    assert "argument RUN_FOLDER" in error(["export", str(tmp_path / "missing"), str(tmp_path / "new")])
    assert "argument --dtype" in error(["export", str(run), str(tmp_path / "new"), "--dtype", "int8"])
    assert not (tmp_path / "new").exists()


def test_state_dict_adapter_round_trip(tmp_path):
    """torchtitan's model state dict → to_hf → the folder (with the adapter's config.json, multipliers included) →
    LanguageModel.from_pretrained, and back through from_hf into a torchtitan model."""
    pytest.importorskip("torchtitan")
    from safetensors.torch import load_file, save_file

    from linrnn.training.model import TitanLanguageModel
    from linrnn.training.state_dict_adapter import LinrnnStateDictAdapter

    config = TitanLanguageModel.Config(cell="gdn", preset="byte-tiny", overrides={"num_layers": 2},
                                       parametrization="gdn-mup", base_width=32)  # fmt: skip
    titan = TitanLanguageModel(config)
    titan.init_weights()
    adapter = LinrnnStateDictAdapter(config, None)
    hf_weights = adapter.to_hf(titan.state_dict())
    assert set(hf_weights) == set(titan.model.hf_state_dict())
    save_file({name: tensor.contiguous() for name, tensor in hf_weights.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(adapter.hf_config()))
    loaded = LanguageModel.from_pretrained(tmp_path)

    def multipliers(model):
        return [model.config.logit_multiplier, *(layer.mixer.config.output_multiplier for layer in model.layers)]

    assert multipliers(loaded) == multipliers(titan.model) != [1.0, 1.0, 1.0]
    ids = prompt()
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), titan.model(ids), rtol=0, atol=0)
    fresh = TitanLanguageModel(config)
    fresh.load_state_dict(adapter.from_hf(load_file(str(tmp_path / "model.safetensors"))), strict=True)
    for (name, value), (_, expected) in zip(fresh.state_dict().items(), titan.state_dict().items(), strict=True):
        torch.testing.assert_close(value, expected, rtol=0, atol=0, msg=name)


def test_registration(tmp_path, monkeypatch):
    """The Auto classes know "linrnn"; without transformers the registration is skipped; the import hook registers
    after the module it waits for has run, then leaves sys.meta_path."""
    assert AutoConfig.for_model("linrnn").model_type == "linrnn"
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if it were not installed
    assert linrnn_hf.register() is False
    linrnn_hf.register_with_transformers()
    monkeypatch.undo()
    (tmp_path / "probe_package.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    monkeypatch.setattr(linrnn_hf, "_register_quietly", lambda: seen.append(sys.modules["probe_package"].VALUE))
    finder = linrnn_hf._RegisterOnImport("probe_package")
    sys.meta_path.insert(0, finder)
    try:
        import probe_package  # noqa: F401
    finally:
        sys.modules.pop("probe_package", None)
    assert seen == [1] and finder not in sys.meta_path
