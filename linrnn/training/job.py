"""The pieces of ``linrnn train`` (the README's main job) around torchtitan's trainer: what a run trains and
validates on (``run_data``: the embedded corpus or your documents, and a tokenizer; ``check_split_sizes``: enough of
each split for a batch); how long it should take (``estimate``, also ``linrnn sweep``'s); after training, the
torchtitan checkpoint as a ``LanguageModel``, validation bits per byte on the whole held-out set, a sample and the
training curve."""

from __future__ import annotations

import functools
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


def _sweep_model(width: int, layers: int, heads: int) -> dict:
    """ModelConfig overrides of ``linrnn sweep``'s model at ``width`` (on the byte-tiny preset)."""
    return dict(vocab_size=4096, hidden_size=width, num_layers=layers, num_heads=heads, intermediate_size=4 * width,
                tie_embeddings=False)  # fmt: skip


def check_split_sizes(stats: dict, seq_len: int, batch: int, validation: bool = True) -> None:
    """``--data``: each split must fill one batch of windows, or torchtitan's loader (``WindowDataLoader``: the
    documents as ``<s> text </s>`` in one stream, cut into windows of ``seq_len + 1`` tokens) stops the run when it
    first reads it (the held-out split: at step 1's validation). A UsageError says what is needed and what each
    split has, before anything is written. ``stats``: ``data.text_stats`` of the split; ``validation``: whether
    torchtitan validates during training (the final bits per byte need no batch)."""
    needed = batch * seq_len + 1
    splits = {"training": "train", **({"held-out": "validation"} if validation else {})}
    tokens = {name: stats[f"{key}_tokens"] + stats[f"{key}_documents"] for name, key in splits.items()}  # + <s>
    short = [name for name, count in tokens.items() if count < needed]
    if not short:
        return
    documents = stats["train_documents"] + stats["validation_documents"]
    have = "; ".join(
        f"the {name} split has {tokens[name]:,}"
        + (f" ({stats['validation_documents']} of the {documents} documents)" if name == "held-out" else "")
        for name in short
    )
    fitting_batch = min((count - 1) // seq_len for count in tokens.values())
    fitting_seq_len = min((count - 1) // batch for count in tokens.values())
    if fitting_batch >= 1:
        hint = f"or a smaller batch after --, e.g. -- --training.local_batch_size {fitting_batch}"
    elif fitting_seq_len >= 2:
        hint = f"or shorter windows after --, e.g. -- --training.seq_len {fitting_seq_len}"
    else:
        hint = "the documents are too short for any batch"
    raise UsageError(
        f"argument --data: one batch of {batch} windows of {seq_len} tokens needs {needed:,} tokens in each split; "
        f"{have}; give more text, {hint}"
    )


# Training throughput measured with linrnn's own runs (tokens/s), per device class: (cell, preset, ModelConfig
# overrides, tokens/s). ``estimate`` places a model among them by its training FLOPs per token
# (``linrnn.training.model.flops_per_token``): between two measured models, log-log interpolation; below the
# smallest, the smallest's rate (small models are bound by per-step overhead, not FLOPs); above the largest, the
# largest's rate scaled down by FLOPs. Checked against runs it was not fitted on: docs/training.md, "Estimates".
MEASURED_WHERE = {"cpu": "2 CPU cores", "cuda": "one H100"}
MEASURED_RATES = {
    "cpu": (
        ("gated_deltanet", "tiny", {"vocab_size": 4096}, 2_300),  # docs/training.md, "Measured": the main job
        # linrnn sweep, 4 layers, 2 heads, 8 × 256 tokens a step: docs/results/sweeps/cpu_toy_sgd.jsonl, medians
        ("gated_deltanet", "byte-tiny", _sweep_model(32, 4, 2), 12_500),
        ("gated_deltanet", "byte-tiny", _sweep_model(256, 4, 2), 2_450),
    ),
    "cuda": (
        ("gated_deltanet", "340m", {"vocab_size": 32000}, 109_000),  # docs/training.md: gdn_340m_sp, eager, bf16
        # linrnn sweep, 8 layers, 6 heads, 32 × 512 tokens a step: docs/results/sweeps/gdn.jsonl, medians
        ("gated_deltanet", "byte-tiny", _sweep_model(128, 8, 6), 162_000),
        ("gated_deltanet", "byte-tiny", _sweep_model(256, 8, 6), 158_000),
        ("gated_deltanet", "byte-tiny", _sweep_model(512, 8, 6), 154_000),
        ("gated_deltanet", "byte-tiny", _sweep_model(1024, 8, 6), 99_000),
    ),
}


@dataclass
class Estimate:
    """How long ``tokens`` of training should take at ``rate`` tokens/s; ``basis`` says where the rate is from."""

    tokens: int
    rate: float
    basis: str

    @property
    def seconds(self) -> float:
        return self.tokens / self.rate

    def describe(self) -> str:
        return f"{_tokens(self.tokens)} tokens at about {self.rate:,.0f} tokens/s: {duration(self.seconds)}"


def estimate(config, tokens: int, device_type: str, seq_len: int | None = None) -> Estimate:
    """The training time of ``tokens`` tokens of the model ``config`` (a ``ModelConfig``) on a device class, "cpu"
    or "cuda", from the rates measured there (``MEASURED_RATES``); ``seq_len`` for attention layers' FLOPs."""
    from linrnn.training.model import flops_per_token

    where = MEASURED_WHERE[device_type]
    points = _measured_points(device_type)  # [(FLOPs per token, tokens/s)], by FLOPs
    flops = flops_per_token(config, seq_len=seq_len)
    for measured, rate in points:
        if abs(flops / measured - 1) < 0.01:
            return Estimate(tokens, rate, f"measured for this model on {where}")
    if flops <= points[0][0]:
        return Estimate(tokens, points[0][1], f"as the smallest model measured on {where}")
    for (low, low_rate), (high, high_rate) in zip(points, points[1:], strict=False):
        if flops <= high:
            share = math.log(flops / low) / math.log(high / low)
            rate = math.exp(math.log(low_rate) + share * math.log(high_rate / low_rate))
            return Estimate(tokens, rate, f"between the models measured on {where}, by FLOPs per token")
    largest, rate = points[-1]
    return Estimate(tokens, rate * largest / flops, f"the largest model measured on {where}, scaled by FLOPs per token")


@functools.cache
def _measured_points(device_type: str) -> tuple[tuple[int, int], ...]:
    from linrnn.models.config import model_config
    from linrnn.training.model import flops_per_token

    measured = MEASURED_RATES[device_type]
    return tuple(sorted((flops_per_token(model_config(cell, preset, **overrides)), rate)
                        for cell, preset, overrides, rate in measured))  # fmt: skip


def duration(seconds: float) -> str:
    """``seconds`` in the unit a reader wants: s, min, h or days."""
    for limit, unit, size in ((90, "s", 1), (90 * 60, "min", 60), (48 * 3600, "h", 3600)):
        if seconds < limit:
            return f"{seconds / size:.0f} {unit}" if unit in ("s", "min") else f"{seconds / size:.1f} {unit}"
    return f"{seconds / 86400:.1f} days"


def _tokens(count: int) -> str:
    return f"{count / 1e9:.1f}B" if count >= 1e9 else f"{count / 1e6:.1f}M" if count >= 1e6 else f"{count:,}"
