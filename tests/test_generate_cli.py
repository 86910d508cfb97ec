"""``linrnn generate``: streamed text from a saved byte model and from a model with its tokenizer folder beside it
(as ``linrnn train`` writes them), equal to the engine's greedy tokens; one-line errors."""

import json

import pytest
import torch

import linrnn
from linrnn.cli import main
from linrnn.inference import Engine, Sampling
from linrnn.models import save_checkpoint


def test_byte_model_greedy_text(tmp_path, capsys):
    torch.manual_seed(0)
    model = linrnn.build_model("gdn", preset="byte-tiny", num_layers=1)
    save_checkpoint(model, tmp_path / "model.pt")
    code = main(["generate", str(tmp_path / "model.pt"), "--prompt", "To be", "--max-new-tokens", "12",
                 "--temperature", "0", "--device", "cpu"])  # fmt: skip
    out, err = capsys.readouterr()
    assert code == 0
    (request,) = Engine(model, slots=1).generate([torch.tensor(list(b"To be"))], Sampling(max_new_tokens=12,
                                                                                          temperature=0))  # fmt: skip
    assert out == bytes(request.tokens).decode("utf-8", errors="replace") + "\n"
    assert "12 tokens in" in err and "tokens/s" in err


def test_model_with_its_tokenizer_folder(tmp_path, capsys):
    """A run folder: model.pt and tokenizer/tokenizer.json; the prompt starts with <s>, </s> stops."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "[UNK]": 5}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    (tmp_path / "tokenizer").mkdir()
    tokenizer.save(str(tmp_path / "tokenizer" / "tokenizer.json"))
    torch.manual_seed(1)
    model = linrnn.build_model("kda", preset="byte-tiny", num_layers=1, vocab_size=6)
    save_checkpoint(model, tmp_path / "model.pt")
    code = main(["generate", str(tmp_path / "model.pt"), "--prompt-file", str(_write(tmp_path, "a b c a")),
                 "--max-new-tokens", "6", "--temperature", "0", "--device", "cpu"])  # fmt: skip
    out, _ = capsys.readouterr()
    assert code == 0
    greedy = Sampling(max_new_tokens=6, temperature=0, stop_tokens=(1,))
    (request,) = Engine(model, slots=1).generate([torch.tensor([0, 2, 3, 4, 2])], greedy)
    assert out == tokenizer.decode(request.tokens) + "\n"


def test_fla_folder_with_its_tokenizer(tmp_path, capsys):
    """An FLA Gated DeltaNet folder (linrnn.to_fla's, as save_pretrained writes one) with tokenizer.json in it."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(models.WordLevel({"<s>": 0, "</s>": 1, "a": 2, "b": 3, "[UNK]": 4}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    torch.manual_seed(2)
    model = linrnn.build_model("gdn", preset="byte-tiny", num_layers=1, vocab_size=5)
    linrnn.to_fla(model, tmp_path / "fla")
    arguments = ["generate", str(tmp_path / "fla"), "--prompt", "a b b", "--max-new-tokens", "5", "--temperature",
                 "0", "--device", "cpu"]  # fmt: skip
    assert main(arguments) == 2
    assert "5 tokens and there is no tokenizer.json in its folder" in capsys.readouterr().err
    tokenizer.save(str(tmp_path / "fla" / "tokenizer.json"))
    assert main(arguments) == 0
    out, _ = capsys.readouterr()
    greedy = Sampling(max_new_tokens=5, temperature=0, stop_tokens=(1,))
    (request,) = Engine(model, slots=1).generate([torch.tensor([0, 2, 3, 3])], greedy)
    assert out == tokenizer.decode(request.tokens) + "\n"


def _write(folder, text):
    path = folder / "prompt.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["missing.pt", "--prompt", "x"], "argument checkpoint: expected a model.pt file"),
        (["MODEL", "--prompt", ""], "expected at least one token, got an empty prompt"),
        (["MODEL", "--prompt-file", "nope.txt"], "argument --prompt-file: no such file"),
        (["MODEL", "--prompt", "x", "--top-p", "2"], "argument --top-p"),
        (["MODEL", "--prompt", "x", "--tokenizer", "."], "argument --tokenizer: expected a folder with tokenizer.json"),
        (["FOREIGN", "--prompt", "x"], "is not a linrnn checkpoint"),
    ],
)
def test_errors_are_one_line(tmp_path, capsys, arguments, message):
    save_checkpoint(linrnn.build_model("gdn", preset="byte-tiny", num_layers=1), tmp_path / "model.pt")
    (tmp_path / "foreign.pt").write_text(json.dumps({"not": "a checkpoint"}))
    names = {"MODEL": str(tmp_path / "model.pt"), "FOREIGN": str(tmp_path / "foreign.pt")}
    code = main(["generate", *(names.get(a, a) for a in arguments), "--device", "cpu"])
    _, err = capsys.readouterr()
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err


def test_prompt_starts_with_one_bos_when_the_tokenizer_adds_its_own(tmp_path):
    """A tokenizer whose post-processor prepends <s> (as many hub tokenizers do): the prompt still has one <s>."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    from linrnn.cli.generate import Text

    vocab = {"<s>": 0, "</s>": 1, "a": 2, "b": 3, "[UNK]": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert tokenizer.encode("a b").ids == [0, 2, 3]
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    assert Text(tmp_path).encode("a b") == [0, 2, 3]
