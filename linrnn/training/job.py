"""The pieces of ``linrnn train`` (the README's main job) around torchtitan's trainer: what a run trains and
validates on (``run_data``: the embedded corpus or your documents, and a tokenizer); after training, the torchtitan
checkpoint as a ``LanguageModel``, validation bits per byte on the whole held-out set, a sample and the training
curve."""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from linrnn import parametrizations
from linrnn.errors import UsageError
from linrnn.models import LanguageModel, generate


def load_trained(config, checkpoint_dir: str | Path) -> LanguageModel:
    """The model of a torchtitan ``Trainer.Config`` (``linrnn.training.configs.build``) with the weights of one
    checkpoint step folder; the parametrization's multipliers are set as in training."""
    import torch.distributed.checkpoint as dcp

    spec = config.model_spec.model
    model = LanguageModel(spec.model_config())
    parametrizations.apply(
        model,
        spec.parametrization,
        base_width=spec.base_width,
        optimizer=spec.optimizer,
        readout_zero_init=spec.readout_zero_init,
    )
    state = {f"model.{name}": tensor for name, tensor in model.state_dict().items()}
    with warnings.catch_warnings():  # one process, no process group: what the reader warns it assumes
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=str(checkpoint_dir), no_dist=True)
    model.load_state_dict({name.removeprefix("model."): tensor for name, tensor in state.items()})
    return model.eval()


def latest_checkpoint(dump_folder: str | Path) -> Path:
    steps = sorted(Path(dump_folder, "checkpoint").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    if not steps:
        raise FileNotFoundError(f"no checkpoint under {dump_folder}/checkpoint")
    return steps[-1]


@torch.no_grad()
def validation_bpb(model: LanguageModel, tokenizer_folder: str | Path, texts: list[str], seq_len: int = 1024) -> float:
    """Bits per byte of ``texts``: each document is ``<s> text </s>``, its targets are every token after ``<s>``;
    one document per row, a longer one continued in rows of ``seq_len`` (each from a zero state)."""
    from tokenizers import Tokenizer

    from linrnn.training.data import BOS, EOS

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_folder) / "tokenizer.json"))
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    nats, byte_count = 0.0, 0
    device = next(model.parameters()).device
    for text in texts:
        byte_count += len(text.encode())
        tokens = [bos, *tokenizer.encode(text).ids, eos]
        for start in range(0, len(tokens) - 1, seq_len):  # a document longer than a row continues in the next
            piece = tokens[start : start + seq_len + 1]
            inputs, targets = torch.tensor([piece[:-1]], device=device), torch.tensor([piece[1:]], device=device)
            nats += float(model.loss(inputs, targets, reduction="sum"))  # each row starts from a zero state
    return nats / math.log(2) / byte_count


def sample(
    model: LanguageModel,
    tokenizer_folder: str | Path,
    prompt: str,
    tokens: int = 120,
    temperature: float = 0.8,
    seed: int = 0,
) -> str:
    from tokenizers import Tokenizer

    from linrnn.training.data import BOS

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_folder) / "tokenizer.json"))
    prompt_ids = torch.tensor([tokenizer.token_to_id(BOS), *tokenizer.encode(prompt).ids])
    out = generate(
        model, prompt_ids, tokens, temperature=temperature, top_k=50, generator=torch.Generator().manual_seed(seed)
    )
    return tokenizer.decode(out.flatten()[1:].tolist())


# Given through --data and --tokenizer, so that validation, bits per byte and samples use them too
DATA_FLAGS = ("--dataloader.dataset", "--dataloader.dataset_path", "--hf_assets_path", "--validator.dataloader")


@dataclass
class RunData:
    """What a run trains and validates on: the dataset flags for torchtitan, the tokenizer folder, the held-out
    texts, their statistics (bytes per token, unigram baselines) and a description."""

    flags: list[str]
    tokenizer: Path
    validation: list[str]
    stats: dict
    description: str
    prompt: str


def run_data(vocab: int, documents: str | None = None, tokenizer_folder: str | None = None) -> RunData:
    """The data of a run whose model has ``vocab`` tokens: ``documents`` (a file, folder or glob; ``--data``) split
    into training and held-out documents, else the embedded corpus; ``tokenizer_folder`` (``--tokenizer``), else
    the embedded corpus's tokenizer of that size (prepared first if need be)."""
    from linrnn.training import data

    if tokenizer_folder is not None:
        tokenizer = Path(tokenizer_folder).expanduser().resolve()
        config_file = tokenizer / "tokenizer_config.json"
        if not (tokenizer / "tokenizer.json").is_file() or not config_file.is_file():
            raise UsageError(
                f"argument --tokenizer: expected a folder with tokenizer.json and tokenizer_config.json, "
                f"got {tokenizer}"
            )
        if not json.loads(config_file.read_text()).get("bos_token"):
            raise UsageError(f"argument --tokenizer: expected a bos_token in {config_file}, found none")
        tokens = data.tokenizer_vocab_size(str(tokenizer))
        if tokens > vocab:
            raise UsageError(f"argument --tokenizer: expected at most the model's {vocab} tokens, got {tokens}")
    else:
        data.prepare(vocab_sizes=(vocab,))
        tokenizer = data.tokenizer_dir(vocab)
    if documents is None:
        stats = data.corpus_stats()
        texts = [json.loads(line)["text"] for line in (data.corpus_dir() / "validation.jsonl").read_text().splitlines()]
        if tokenizer_folder is not None:
            train = [json.loads(line)["text"] for line in (data.corpus_dir() / "train.jsonl").read_text().splitlines()]
            stats = data.text_stats(tokenizer, train, texts)
        else:
            stats = {
                **stats["tokenizers"][str(vocab)],
                **{k: stats[k] for k in ("byte_unigram_bpb", "validation_bytes")},
            }
        corpus = f"the embedded corpus ({data.CORPUS_PACKAGE})"
        return RunData([], tokenizer, texts, stats, corpus, "ROMEO.\n")
    path = str(Path(documents).expanduser().resolve()) if Path(documents).expanduser().exists() else documents
    try:
        train, texts = data.held_out_split(list(data.load_text_files(path)["text"]))
    except (FileNotFoundError, ValueError) as error:
        raise UsageError(f"argument --data: {error}") from error
    stats = data.text_stats(tokenizer, train, texts)
    flags = ["--dataloader.dataset", "files_train", "--dataloader.dataset_path", path]
    flags += ["--validator.dataloader.dataset", "files_validation", "--validator.dataloader.dataset_path", path]
    flags += ["--metrics.bytes_per_token", repr(stats["bytes_per_token"])]
    content = hashlib.sha256("\n".join(train + texts).encode()).hexdigest()[:12]
    return RunData(flags, tokenizer, texts, stats, f"{path} (content {content})", "")


def plot_training_curve(metrics_file: Path, out_file: Path, tokens_per_step: int) -> None:
    """Training loss and bits per byte (training and validation) against tokens seen, from metrics.jsonl."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.exists() else []
    train = [r for r in records if r.get("loss") is not None]
    validation = [r for r in records if r.get("validation_bpb") is not None]
    figure, (loss_axes, bpb_axes) = plt.subplots(1, 2, figsize=(10, 4))
    loss_axes.plot([r["step"] * tokens_per_step for r in train], [r["loss"] for r in train])
    loss_axes.set(xlabel="tokens", ylabel="training loss (nats per token)")
    bpb_axes.plot([r["step"] * tokens_per_step for r in train], [r["bpb"] for r in train], label="training")
    bpb_axes.plot([r["step"] * tokens_per_step for r in validation], [r["validation_bpb"] for r in validation], "o-",
                  label="validation")  # fmt: skip
    bpb_axes.set(xlabel="tokens", ylabel="bits per byte")
    bpb_axes.legend()
    figure.tight_layout()
    figure.savefig(out_file)
    plt.close(figure)
