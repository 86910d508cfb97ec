"""``linrnn generate``: streamed text from a saved byte model, from a model with its tokenizer folder beside it and
from a ``linrnn train`` run folder, equal to the engine's greedy tokens, after the echoed prompt; the first call's
line before and its time after; one CPU thread by default; one-line errors (exit 2, nothing on stdout), a prompt file
that is not UTF-8 among them."""

import json
import re
import sys

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
    continuation = bytes(request.tokens).decode("utf-8", errors="replace")
    assert out == "To be" + continuation + "\n"  # the prompt, echoed, then the new text
    assert "12 tokens in" in err and "tokens/s" in err
    assert main(["generate", str(tmp_path / "model.pt"), "--prompt", "To be", "--max-new-tokens", "12",
                 "--temperature", "0", "--device", "cpu", "--no-echo"]) == 0  # fmt: skip
    assert capsys.readouterr().out == continuation + "\n"


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
    assert out == "a b c a" + " " + tokenizer.decode(request.tokens) + "\n"  # the new text decoded after the prompt


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
    assert out == "a b b " + tokenizer.decode(request.tokens) + "\n"


def _write(folder, text):
    path = folder / "prompt.txt"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "arguments, message",
    [
        (
            ["missing.pt", "--prompt", "x"],
            "argument checkpoint: expected a model.pt file, a `linrnn train` run "
            "folder (model.pt, tokenizer/) or an FLA folder (config.json), got "
            "missing.pt (no such file or folder)",
        ),  # fmt: skip
        (["EMPTY", "--prompt", "x"], "has neither model.pt nor config.json"),
        (["UNFINISHED", "--prompt", "x"], "got the run folder UNFINISHED without model.pt (linrnn train writes it"),
        (
            ["MODEL", "--prompt-file", "LATIN1"],
            "argument --prompt-file: expected UTF-8 text in LATIN1, got byte 0xe9 "
            "at byte offset 5 (invalid continuation byte)",
        ),  # fmt: skip
        (
            ["MODEL", "--prompt", "caf\udce9"],
            "argument --prompt: expected UTF-8 text, got bytes that are not UTF-8 at character 3",
        ),  # fmt: skip
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
    (tmp_path / "empty").mkdir()
    (tmp_path / "unfinished").mkdir()
    (tmp_path / "unfinished" / "linrnn-run.json").write_text("{}")  # a run folder before training ends
    (tmp_path / "latin1.txt").write_bytes(b"caf\xc3\xa9\xe9 au lait")  # é in UTF-8, then a Latin-1 é at offset 5
    names = {"MODEL": tmp_path / "model.pt", "FOREIGN": tmp_path / "foreign.pt", "EMPTY": tmp_path / "empty",
             "UNFINISHED": tmp_path / "unfinished", "LATIN1": tmp_path / "latin1.txt"}  # fmt: skip
    code = main(["generate", *(str(names.get(a, a)) for a in arguments), "--device", "cpu"])
    out, err = capsys.readouterr()
    for name, path in names.items():
        message = message.replace(name, str(path))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1, err
    assert out == ""  # nothing written


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


def word_tokenizer(folder):
    """A word-level tokenizer with <s> and </s>, saved as folder/tokenizer.json."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tokenizer = Tokenizer(
        models.WordLevel({"<s>": 0, "</s>": 1, "a": 2, "b": 3, "c": 4, "[UNK]": 5}, unk_token="[UNK]")
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    return tokenizer


def test_a_run_folder(tmp_path, capsys):
    """`linrnn generate RUN_FOLDER`: its model.pt and tokenizer/, the text of `linrnn generate RUN_FOLDER/model.pt`."""
    run = tmp_path / "outputs" / "kda_tiny_sp"
    word_tokenizer(run / "tokenizer")
    (run / "linrnn-run.json").write_text("{}")
    torch.manual_seed(3)
    save_checkpoint(linrnn.build_model("kda", preset="byte-tiny", num_layers=1, vocab_size=6, init_std=0.2),
                    run / "model.pt")  # fmt: skip
    options = ["--prompt", "a b", "--max-new-tokens", "5", "--temperature", "0.9", "--seed", "4", "--device", "cpu"]
    assert main(["generate", str(run), *options]) == 0
    from_folder = capsys.readouterr().out
    assert main(["generate", str(run / "model.pt"), *options]) == 0
    assert capsys.readouterr().out == from_folder and from_folder.startswith("a b")


@pytest.fixture
def threads():
    """torch's thread count, restored after the test (the CLI sets it for the process)."""
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_first_call_and_threads(tmp_path, capsys, monkeypatch, threads):
    """stderr: the first call's line before it and its time after it, then the speed on one CPU thread unless
    --threads or OMP_NUM_THREADS says otherwise."""
    save_checkpoint(linrnn.build_model("gdn", preset="byte-tiny", num_layers=1), tmp_path / "model.pt")
    arguments = ["generate", str(tmp_path / "model.pt"), "--prompt", "x", "--max-new-tokens", "3", "--device", "cpu"]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    torch.set_num_threads(2)
    assert main(arguments) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    assert lines[0] == ("first call: setting up the decode step (torch imports its compiler modules at the first "
                        "custom-op call; nothing is compiled on the CPU) …")  # fmt: skip
    assert re.fullmatch(r"first call: \d+\.\d s; every run pays it once", lines[1]), lines[1]
    assert re.fullmatch(r"3 tokens in .* s \(.* tokens/s, prompt 1 tokens, cpu, 1 thread\)", lines[2]), lines[2]
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert main([*arguments, "--threads", "3"]) == 0
    assert capsys.readouterr().err.splitlines()[2].endswith("cpu, 3 threads)") and torch.get_num_threads() == 3
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the user's choice: torch's count stays
    torch.set_num_threads(2)
    assert main(arguments) == 0
    assert capsys.readouterr().err.splitlines()[2].endswith("cpu, 2 threads)")
    from linrnn.cli.generate import first_call_notice

    preparing, reused = first_call_notice(torch.device("cuda"))
    assert "Triton" in preparing and "CUDA graph" in preparing and "later runs" in reused


def test_the_prompt_is_dim_on_a_terminal(tmp_path, capsys, monkeypatch):
    save_checkpoint(linrnn.build_model("gdn", preset="byte-tiny", num_layers=1), tmp_path / "model.pt")
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)
    assert main(["generate", str(tmp_path / "model.pt"), "--prompt", "To be", "--max-new-tokens", "2",
                 "--device", "cpu"]) == 0  # fmt: skip
    assert capsys.readouterr().out.startswith("\x1b[2mTo be\x1b[0m")
