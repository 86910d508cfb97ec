"""The lm-eval-harness model ``linrnn`` on local tasks (no hub): the loglikelihoods lm-eval reports are the model's
own log-probabilities of the same text, the rolling loglikelihood is minus its total loss on the document,
generate_until is ``linrnn.generate``'s greedy text cut at the stop string; registration (import and entry point);
a folder that is not linrnn's is one clear error."""

from __future__ import annotations

import functools
import json
import math
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import lm_eval
import lm_eval.api.instance
import lm_eval.tasks
import pytest
import torch
import yaml

import linrnn
from linrnn.errors import UsageError
from linrnn.evaluation import checkpoints, harness
from linrnn.text import TEXT
from tests.evaluation.run_folders import make_run_folder, small_model, train_tokenizer

LOGLIKELIHOOD_DOCS = [
    {"context": "Shall I compare thee", "continuation": " to a summer's day?"},
    {"context": "Rough winds do shake the darling buds of May,\nAnd summer's lease", "continuation": " hath all"},
    {"context": "", "continuation": "Thou art more lovely and more temperate"},  # lm-eval gives <s> alone as context
]
ROLLING_DOCS = [{"text": TEXT[:300]}, {"text": TEXT[300:]}]
PROMPTS = ["Shall I compare", "So long as men can breathe"]
NEW_TOKENS = 12


@pytest.fixture(scope="module", autouse=True)
def offline():
    """No hub: the environment variables, and the flags datasets and huggingface_hub read from them on import."""
    import datasets.config
    import huggingface_hub.constants

    with pytest.MonkeyPatch.context() as patch:
        for name in ("HF_DATASETS_OFFLINE", "HF_HUB_OFFLINE"):
            patch.setenv(name, "1")
            patch.setattr(datasets.config, name, True)
        patch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A run folder with a random 1-layer GDN and a BPE tokenizer; its greedy texts; three local tasks."""
    root = tmp_path_factory.mktemp("harness")
    tokenizer = train_tokenizer(root / "tokenizer-source")
    tokens = checkpoints.Tokens.from_folder(tokenizer)
    torch.manual_seed(0)
    model = small_model(tokens.tokenizer.get_vocab_size())
    run = make_run_folder(root / "gdn_tiny_sp", model, tokenizer)
    greedy = [greedy_text(model, tokens, prompt) for prompt in PROMPTS]
    assert len(greedy[0]) >= 6
    stop = greedy[0][3:5]  # a stop string the first generation reaches
    tasks = root / "tasks"
    tasks.mkdir()
    write_task(tasks, root, "toy_loglikelihood", LOGLIKELIHOOD_DOCS, output_type="loglikelihood",
               doc_to_text="{{context}}", doc_to_target="{{continuation}}", target_delimiter="",
               metric_list=[{"metric": "acc"}])  # fmt: skip
    write_task(tasks, root, "toy_rolling", ROLLING_DOCS, output_type="loglikelihood_rolling", doc_to_text="",
               doc_to_target="{{text}}", metric_list=[{"metric": "bits_per_byte"}])  # fmt: skip
    write_task(tasks, root, "toy_generate", [{"prompt": p, "target": "x"} for p in PROMPTS],
               output_type="generate_until", doc_to_text="{{prompt}}", doc_to_target="{{target}}",
               generation_kwargs={"until": [stop], "max_gen_toks": NEW_TOKENS, "do_sample": False},
               metric_list=[{"metric": "exact_match"}])  # fmt: skip
    return {"run": run, "model": model, "tokens": tokens, "greedy": greedy, "stop": stop, "tasks": tasks}


def write_task(folder: Path, root: Path, name: str, docs: list[dict], **config) -> None:
    """A task reading ``docs`` from a local JSON file (datasets' json builder; nothing from the hub)."""
    (root / f"{name}.json").write_text(json.dumps(docs))
    dataset = {"data_files": {"test": str(root / f"{name}.json")}, "cache_dir": str(root / "datasets-cache")}
    task = {"task": name, "dataset_path": "json", "dataset_kwargs": dataset, "test_split": "test", **config}
    (folder / f"{name}.yaml").write_text(yaml.safe_dump(task))


def greedy_text(model, tokens: checkpoints.Tokens, prompt: str) -> str:
    """``linrnn.generate``'s greedy continuation of ``<s> prompt``, up to ``</s>``."""
    ids = torch.tensor([tokens.bos, *tokens.encode(prompt)])
    new = linrnn.generate(model, ids, NEW_TOKENS, temperature=0)[len(ids) :].tolist()
    return tokens.decode(new[: new.index(tokens.eos)] if tokens.eos in new else new)


@pytest.fixture(scope="module")
def results(setup):
    task_manager = lm_eval.tasks.TaskManager(include_path=str(setup["tasks"]), include_defaults=False)
    return lm_eval.simple_evaluate(
        model="linrnn",
        model_args={"pretrained": str(setup["run"]), "device": "cpu", "batch_size": 2},
        tasks=["toy_loglikelihood", "toy_rolling", "toy_generate"],
        task_manager=task_manager,
        log_samples=True,
        bootstrap_iters=0,
    )


def scored(model, tokens: checkpoints.Tokens, context: str, continuation: str) -> tuple[float, bool]:
    """The continuation's log-probability after ``<s> context``, and whether each of its tokens is the argmax."""
    context_ids, continuation_ids = [tokens.bos, *tokens.encode(context)], tokens.encode(continuation)
    assert tokens.encode(context + continuation) == context_ids[1:] + continuation_ids  # the same split
    return last_tokens_scored(model, context_ids + continuation_ids, len(continuation_ids))


def last_tokens_scored(model, ids: list[int], count: int) -> tuple[float, bool]:
    """The log-probability of the last ``count`` of ``ids`` from one plain forward, and whether each is the
    argmax."""
    with torch.no_grad():
        log_probs = model(torch.tensor([ids[:-1]]))[0, len(ids) - 1 - count :].log_softmax(-1)
    targets = torch.tensor(ids[len(ids) - count :])
    greedy = bool((log_probs.argmax(-1) == targets).all())
    return float(log_probs[torch.arange(count), targets].sum()), greedy


def test_loglikelihood_is_the_models_log_probability_of_the_continuation(setup, results):
    samples = sorted(results["samples"]["toy_loglikelihood"], key=lambda sample: sample["doc_id"])
    assert [sample["arguments"][0] for sample in samples] == [(d["context"], d["continuation"])
                                                              for d in LOGLIKELIHOOD_DOCS]  # fmt: skip
    for sample, doc in zip(samples, LOGLIKELIHOOD_DOCS, strict=True):
        log_prob, greedy = sample["filtered_resps"][0]
        expected, expected_greedy = scored(setup["model"], setup["tokens"], doc["context"], doc["continuation"])
        assert log_prob == pytest.approx(expected, rel=1e-5, abs=1e-5) and greedy == expected_greedy


def test_rolling_loglikelihood_is_minus_the_total_loss_on_the_document(setup, results):
    samples = sorted(results["samples"]["toy_rolling"], key=lambda sample: sample["doc_id"])
    total_bits = 0.0
    for sample, doc in zip(samples, ROLLING_DOCS, strict=True):
        ids = setup["tokens"].encode(doc["text"])
        inputs = torch.tensor([[setup["tokens"].bos, *ids[:-1]]])
        with torch.no_grad():
            loss = float(setup["model"].loss(inputs, torch.tensor([ids]), reduction="sum"))
        assert sample["filtered_resps"][0] == pytest.approx(-loss, rel=1e-5)
        total_bits += loss / math.log(2)
    text_bytes = sum(len(doc["text"].encode()) for doc in ROLLING_DOCS)
    assert results["results"]["toy_rolling"]["bits_per_byte,none"] == pytest.approx(total_bits / text_bytes, rel=1e-5)


def test_generate_until_is_the_greedy_text_cut_at_the_stop_string(setup, results):
    samples = sorted(results["samples"]["toy_generate"], key=lambda sample: sample["doc_id"])
    expected = [text.split(setup["stop"], 1)[0] for text in setup["greedy"]]
    assert [sample["filtered_resps"][0] for sample in samples] == expected
    assert len(expected[0]) < len(setup["greedy"][0])  # the stop string did cut


def test_max_length_keeps_the_last_tokens(setup):
    """With max_length=8 a request sees its last 9 tokens: the continuation's log-probability after the context's
    last tokens, from a zero state."""
    model = harness.LinrnnLM(pretrained=str(setup["run"]), device="cpu", max_length=8)
    context, continuation = LOGLIKELIHOOD_DOCS[1]["context"], LOGLIKELIHOOD_DOCS[1]["continuation"]
    request = lm_eval.api.instance.Instance("loglikelihood", {}, (context, continuation), 0)
    ((log_prob, _),) = model.loglikelihood([request], disable_tqdm=True)
    tokens = setup["tokens"]
    last = [tokens.bos, *tokens.encode(context + continuation)][-9:]
    expected, _ = last_tokens_scored(setup["model"], last, len(tokens.encode(continuation)))
    assert log_prob == pytest.approx(expected, rel=1e-5)
    assert log_prob != pytest.approx(scored(setup["model"], tokens, context, continuation)[0])  # the cut mattered


def test_an_fla_folder_scores_as_its_run_folder_does(setup, tmp_path):
    """The same weights written as an FLA checkpoint (config.json, safetensors) with tokenizer.json beside them."""
    linrnn.to_fla(setup["model"], tmp_path / "fla")
    (tmp_path / "fla" / "tokenizer.json").write_bytes((setup["run"] / "tokenizer" / "tokenizer.json").read_bytes())
    model = harness.LinrnnLM(pretrained=str(tmp_path / "fla"), device="cpu")
    assert model.checkpoint.kind == "FLA"
    doc = LOGLIKELIHOOD_DOCS[0]
    request = lm_eval.api.instance.Instance("loglikelihood", {}, (doc["context"], doc["continuation"]), 0)
    ((log_prob, _),) = model.loglikelihood([request], disable_tqdm=True)
    expected, _ = scored(setup["model"], setup["tokens"], doc["context"], doc["continuation"])
    assert log_prob == pytest.approx(expected, rel=1e-5)


def test_the_model_is_registered_on_import_and_as_an_entry_point():
    assert lm_eval.api.registry.get_model("linrnn") is harness.LinrnnLM
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"]["lm_eval.models"]["linrnn"]
    assert EntryPoint("linrnn", target, "lm_eval.models").load() is harness.LinrnnLM


def test_a_folder_that_is_not_linrnns_is_one_clear_error(setup, tmp_path, monkeypatch, capsys):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "model.pt").write_bytes((setup["run"] / "model.pt").read_bytes())  # no manifest: not opened
    with pytest.raises(UsageError, match="model_args pretrained: expected a linrnn run folder .* neither linrnn-run"):
        lm_eval.simple_evaluate(model="linrnn", model_args={"pretrained": str(foreign), "device": "cpu"},
                                tasks=["toy_loglikelihood"], task_manager=lm_eval.tasks.TaskManager(
                                    include_path=str(setup["tasks"]), include_defaults=False))  # fmt: skip
    # python -m linrnn.evaluation.harness: lm-eval's command line; its index of built-in tasks takes ~40 s to
    # build, so here it indexes the local tasks only
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(lm_eval.tasks.TaskManager,
                                                                         include_defaults=False))  # fmt: skip
    arguments = ["--model", "linrnn", "--tasks", "toy_loglikelihood", "--include_path", str(setup["tasks"]),
                 "--device", "cpu", "--model_args"]  # fmt: skip
    assert harness.main([*arguments, f"pretrained={foreign}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("python -m linrnn.evaluation.harness: model_args pretrained: expected a linrnn run folder")
    assert harness.main([*arguments, f"pretrained={setup['run']}"]) == 0
    assert "toy_loglikelihood" in capsys.readouterr().out


def test_generate_until_on_an_attention_model(setup, tmp_path):
    """Attention layers keep a KV cache in the engine's slots, sized to the call's longest request: greedy tokens
    equal to the full forward's argmax, cut at the stop string."""
    tokens = setup["tokens"]
    torch.manual_seed(2)
    model = small_model(tokens.tokenizer.get_vocab_size(), cell="attention")
    run = make_run_folder(tmp_path / "attention_tiny_sp", model, setup["run"] / "tokenizer", config="attention_tiny_sp")
    lm = harness.LinrnnLM(pretrained=str(run), device="cpu")
    context = PROMPTS[1]
    ids = [tokens.prefix, *tokens.encode(context)]
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
    full = tokens.decode(ids[len(tokens.encode(context)) + 1 :])
    stop = full[2:4]
    options = {"until": [stop], "max_gen_toks": NEW_TOKENS, "do_sample": False}
    request = lm_eval.api.instance.Instance("generate_until", {}, (context, options), 0)
    assert lm.generate_until([request], disable_tqdm=True) == [full.split(stop, 1)[0]]


def test_an_unknown_task_is_one_line(setup, monkeypatch, capsys):
    monkeypatch.setattr(lm_eval.tasks, "TaskManager", functools.partial(lm_eval.tasks.TaskManager,
                                                                         include_defaults=False))  # fmt: skip
    arguments = ["--model", "linrnn", "--tasks", "no_such_task", "--include_path", str(setup["tasks"]), "--device",
                 "cpu", "--model_args", f"pretrained={setup['run']}"]  # fmt: skip
    assert harness.main(arguments) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("python -m linrnn.evaluation.harness: argument --tasks: Tasks not found")
    assert "no_such_task" in err[-1]
