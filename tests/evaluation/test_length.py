"""``linrnn eval length``: loss by token position. Buckets; one bucket is the model's own loss over the text's
bytes; a context-blind model's buckets equal its per-token losses computed one token at a time; the forward in
pieces equals one forward; the command writes JSON and a plot; bad input is one line."""

from __future__ import annotations

import json
import math
import shutil

import pytest
import torch
from rich.console import Console

from linrnn.cli import main
from linrnn.evaluation import checkpoints, length
from linrnn.evaluation.scoring import target_log_probs
from linrnn.models import load_checkpoint
from linrnn.text import TEXT
from tests.evaluation.run_folders import make_run_folder, small_model, train_tokenizer


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("length")
    tokenizer = train_tokenizer(root / "tokenizer-source")
    torch.manual_seed(0)
    model = small_model(checkpoints.Tokens.from_folder(tokenizer).tokenizer.get_vocab_size())
    return make_run_folder(root / "gdn_tiny_sp", model, tokenizer)


@pytest.fixture(scope="module")
def checkpoint(run_folder):
    return checkpoints.load(run_folder, "argument RUN_FOLDER", torch.device("cpu"))


def test_bucket_edges_double_from_64_up_to_the_length():
    assert length.bucket_edges(1000) == [0, 64, 128, 256, 512, 1000]
    assert length.bucket_edges(512) == [0, 64, 128, 256, 512]
    assert length.bucket_edges(130) == [0, 64, 128, 130]
    assert length.bucket_edges(10) == [0, 10]


def test_one_bucket_is_the_models_loss_over_the_texts_bytes(checkpoint):
    ids = checkpoint.tokens.encode(TEXT)
    scored = length.score_document(checkpoint, length.Document("sonnet", TEXT), max_tokens=None)
    (bucket,) = length.buckets([scored], [0, len(ids)])
    inputs = torch.tensor([[checkpoint.tokens.bos, *ids[:-1]]])
    with torch.no_grad():
        nats = float(checkpoint.model.loss(inputs, torch.tensor([ids]), reduction="sum"))
    assert bucket.tokens == len(ids) and bucket.bytes == len(TEXT.encode())
    assert bucket.bits_per_byte == pytest.approx(nats / math.log(2) / len(TEXT.encode()), rel=1e-5)


def test_a_context_blind_model_gives_each_token_its_own_loss_in_its_bucket(run_folder):
    """With every mixer's output projection zero, a token's logits depend on the token before it only: each
    token's loss is a forward of that one token, and each bucket sums those of its positions."""
    checkpoint = checkpoints.load(run_folder, "argument RUN_FOLDER", torch.device("cpu"))
    for layer in checkpoint.model.layers:
        torch.nn.init.zeros_(layer.mixer.o_proj.weight)
    ids = checkpoint.tokens.encode(TEXT)
    assert len(ids) > 256  # four buckets or more
    scored = length.score_document(checkpoint, length.Document("sonnet", TEXT), max_tokens=None)
    edges = length.bucket_edges(len(ids))
    previous = torch.tensor([checkpoint.tokens.bos, *ids[:-1]])[:, None]  # [n, 1]: each token alone
    with torch.no_grad():
        one_token = checkpoint.model(previous)[:, 0].log_softmax(-1)[torch.arange(len(ids)), ids]
    bits = -one_token.double() / math.log(2)
    token_bytes = [len(checkpoint.tokens.decode([token]).encode()) for token in ids]  # the sonnet is ASCII
    found = length.buckets([scored], edges)
    assert [(b.start, b.end) for b in found] == list(zip(edges, edges[1:], strict=False))
    for bucket in found:
        assert bucket.bytes == sum(token_bytes[bucket.start : bucket.end])
        assert bucket.bits == pytest.approx(float(bits[bucket.start : bucket.end].sum()), rel=1e-5)


def test_the_forward_in_pieces_equals_one_forward(checkpoint):
    tokens = torch.tensor([[checkpoint.tokens.bos, *checkpoint.tokens.encode(TEXT)[:200]]] * 2)
    in_pieces, greedy = target_log_probs(checkpoint.model, tokens, piece_tokens=2 * 37)
    with torch.no_grad():
        logits = checkpoint.model(tokens[:, :-1]).float()
    whole = logits.log_softmax(-1).gather(-1, tokens[:, 1:, None])[..., 0]
    torch.testing.assert_close(in_pieces, whole, rtol=1e-5, atol=1e-5)
    assert torch.equal(greedy, logits.argmax(-1) == tokens[:, 1:])


def test_the_held_out_plays_are_whole_works_from_their_passages(tmp_path, monkeypatch):
    """The corpus's validation.jsonl holds each held-out work's passages in order (linrnn.training.data)."""
    from linrnn.training import data

    passages = [("cymbeline", "Act I"), ("cymbeline", "Scene 1"), ("othello", "Act I"), ("othello", "Scene 2")]
    (tmp_path / "validation.jsonl").write_text("".join(json.dumps({"text": t, "work": w}) + "\n" for w, t in passages))
    monkeypatch.setattr(data, "prepare", lambda vocab_sizes, log: tmp_path)
    plays = length.held_out_plays(Console())
    assert [(play.name, play.text) for play in plays] == [
        ("cymbeline", "Act I\n\nScene 1"),
        ("othello", "Act I\n\nScene 2"),
    ]


def test_the_command_writes_json_and_plot(run_folder, tmp_path, capsys):
    torch.manual_seed(1)
    vocab = load_checkpoint(run_folder / "model.pt").config.vocab_size
    other = make_run_folder(tmp_path / "kda_run", small_model(vocab, "kda"), run_folder / "tokenizer", "kda_tiny_sp")
    short, long = tmp_path / "short.txt", tmp_path / "long.txt"
    short.write_text(TEXT[:200], encoding="utf-8")
    long.write_text(TEXT, encoding="utf-8")
    out = tmp_path / "length.json"
    arguments = ["eval", "length", str(run_folder), str(other), "--data", str(short), str(long), "--max-tokens",
                 "150", "--labels", "gdn", "kda", "--device", "cpu", "--out", str(out)]  # fmt: skip
    assert main(arguments) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text())
    assert out.with_suffix(".png").stat().st_size > 0
    assert [m["label"] for m in report["models"]] == ["gdn", "kda"] and report["max_tokens"] == 150
    gdn = report["models"][0]
    assert gdn["training_seq_len"] == 256 and gdn["config"] == "gdn_tiny_sp"
    short_document, long_document = gdn["documents"]
    assert (short_document["name"], short_document["cut"]) == ("short.txt", False) and short_document["tokens"] < 150
    assert (long_document["name"], long_document["cut"], long_document["tokens"]) == ("long.txt", True, 150)
    assert [(b["start"], b["end"]) for b in gdn["buckets"]] == [(0, 64), (64, 128), (128, 150)]
    assert sum(b["tokens"] for b in gdn["buckets"]) == gdn["tokens"]
    assert gdn["bits_per_byte"] == pytest.approx(sum(b["bits"] for b in gdn["buckets"]) / gdn["bytes"])
    assert "cut to the first 150 tokens" in printed and "long.txt" in printed
    assert main(arguments) == 0
    assert f"replacing {out}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "case, message",
    [
        ("no_manifest", "which has neither linrnn-run.json nor config.json"),
        ("unfinished_run", "without model.pt (is its training finished?)"),
        ("missing_data", "argument --data: expected a UTF-8 text file, got"),
        ("latin1_data", "argument --data: expected UTF-8 text, got"),
        ("missing_out_folder", "argument --out: expected a file in an existing folder"),
        ("labels", "argument --labels: expected one per RUN_FOLDER (1), got 2"),
    ],
)
def test_bad_input_is_one_line(run_folder, tmp_path, capsys, case, message):
    folder, data, out, extra = run_folder, tmp_path / "doc.txt", tmp_path / "out.json", []
    data.write_text("To be, or not to be", encoding="utf-8")
    if case == "no_manifest":  # a model.pt without linrnn's manifest is not opened
        folder = tmp_path / "foreign"
        folder.mkdir()
        (folder / "model.pt").write_bytes((run_folder / "model.pt").read_bytes())
    elif case == "unfinished_run":
        folder = tmp_path / "unfinished"
        shutil.copytree(run_folder, folder, ignore=shutil.ignore_patterns("model.pt"))
    elif case == "missing_data":
        data = tmp_path / "absent.txt"
    elif case == "latin1_data":
        data.write_bytes("Fortinbras, très bien".encode("latin-1"))
    elif case == "missing_out_folder":
        out = tmp_path / "absent" / "out.json"
    else:
        extra = ["--labels", "a", "b"]
    code = main(["eval", "length", str(folder), "--data", str(data), "--out", str(out), "--device", "cpu", *extra])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.startswith("linrnn eval length: ") and err.count("\n") == 1
    assert not out.exists()
