"""After training: load a torchtitan checkpoint into a ``LanguageModel``, measure validation bits per byte on
the whole held-out set, and sample text. Also the ``linrnn train`` main job and ``linrnn data prepare``."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from linrnn import parametrizations
from linrnn.errors import UsageError
from linrnn.models import LanguageModel, generate, save_checkpoint


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


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    # No torchtitan import here: linrnn.training.compat must patch it first (in train_main)
    from linrnn.training import names

    cells = list(names.CELLS)
    parser.add_argument("--cell", default="gdn", help=f"{', '.join(cells[:-1])} or {cells[-1]} (default gdn)")
    parser.add_argument("--size", default="tiny", help="tiny, paper-256 … paper-1536, 340m or 1.3b (default tiny)")
    parser.add_argument("--param", default="sp", help="sp, mup or gdn-mup (default sp)")
    parser.add_argument("--steps", type=int, default=250, help="training steps (default 250)")
    parser.add_argument("--data", help="your documents: a .txt/.jsonl/.json/.parquet file, folder or glob")
    parser.add_argument("--tokenizer", help="folder with tokenizer.json and tokenizer_config.json (default: the "
                        "embedded corpus's tokenizer for the size)")  # fmt: skip
    parser.add_argument("--out", help="run folder (default outputs/<config name>); resumed if it holds this run")
    parser.add_argument("--fresh", action="store_true", help="start over: delete the run folder's linrnn outputs")
    parser.add_argument("overrides", nargs="*", help="further torchtitan flags after --, e.g. -- --optimizer.lr 1e-3")


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


def run_data(args: argparse.Namespace, vocab: int) -> RunData:
    from linrnn.training import data

    if args.tokenizer is not None:
        tokenizer = Path(args.tokenizer).expanduser().resolve()
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
    if args.data is None:
        stats = data.corpus_stats()
        texts = [json.loads(line)["text"] for line in (data.corpus_dir() / "validation.jsonl").read_text().splitlines()]
        if args.tokenizer is not None:
            train = [json.loads(line)["text"] for line in (data.corpus_dir() / "train.jsonl").read_text().splitlines()]
            stats = data.text_stats(tokenizer, train, texts)
        else:
            stats = {
                **stats["tokenizers"][str(vocab)],
                **{k: stats[k] for k in ("byte_unigram_bpb", "validation_bytes")},
            }
        corpus = f"the embedded corpus ({data.CORPUS_PACKAGE})"
        return RunData([], tokenizer, texts, stats, corpus, "ROMEO.\n")
    path = str(Path(args.data).expanduser().resolve()) if Path(args.data).expanduser().exists() else args.data
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


def train_main(args: argparse.Namespace) -> int:
    """The README's main job: train a named config through torchtitan in a run folder, report validation bpb on the
    held-out documents next to the unigram baselines, and a sample; the run's own data and tokenizer throughout."""
    from linrnn import train as entry
    from linrnn.training import compat, names, runs

    # arguments, data and run folder are checked before torchtitan loads (seconds): errors come at once
    cell = {registry: short for short, registry in names.CELLS.items()}.get(args.cell, args.cell)
    size = names.SIZE_ALIASES.get(args.size, args.size)
    param = names.PARAMETRIZATION_ALIASES.get(args.param, args.param)
    for flag, value, known in (("--cell", cell, names.CELLS), ("--size", size, names.SIZES),
                               ("--param", param, names.PARAMETRIZATIONS)):  # fmt: skip
        if value not in known:
            raise UsageError(f"argument {flag}: expected one of {', '.join(known)}, got {value!r}")
    if args.steps < 1:
        raise UsageError(f"argument --steps: expected a positive number of steps, got {args.steps}")
    given = [flag for flag in args.overrides if flag.split("=")[0].startswith(DATA_FLAGS)]
    if given:
        raise UsageError(f"torchtitan flag {given[0]}: give your data and tokenizer as --data PATH and --tokenizer DIR")
    name = f"{cell}_{size}_{param}"
    out = Path(args.out or f"outputs/{name}")
    run = run_data(args, names.SIZES[size].vocab)
    identity = runs.Identity(
        name, tuple(args.overrides), run.description, runs.file_sha256(run.tokenizer / "tokenizer.json")
    )
    manifest = runs.open_run(out, identity, args.steps, args.fresh)
    done = runs.latest_step(out) if manifest else 0
    if manifest and manifest.get("result") and done >= args.steps:
        result = manifest["result"]
        print(f"{name} in {out} is finished: {done} steps, validation {result['bpb']:.3f} bits per byte "
              f"(token unigram baseline {result['token_unigram_bpb']:.3f}); --steps above {done} trains on, "
              f"--fresh starts over")  # fmt: skip
        return 0 if result["bpb"] < result["token_unigram_bpb"] else 1
    if done:
        print(f"resuming {name} at step {done} from {out}")
    compat.install()
    from linrnn.training import configs

    runs.write_manifest(out, identity, args.steps)
    shutil.copytree(run.tokenizer, out / "tokenizer", dirs_exist_ok=True)
    started = time.perf_counter()
    flags = ["--config", name, "--training.steps", str(args.steps), "--dump_folder", str(out)]
    flags += ["--hf_assets_path", str(run.tokenizer), "--metrics.log_freq", "25", "--validator.freq", "125"]
    entry.main([*flags, *run.flags, *args.overrides])
    seconds = time.perf_counter() - started
    config = configs.build(configs.CELLS[cell], size, configs.PARAMETRIZATIONS[param])
    model = load_trained(config, latest_checkpoint(out))
    save_checkpoint(model, out / "model.pt")
    bpb = validation_bpb(model, run.tokenizer, run.validation)
    baseline = run.stats["token_unigram_bpb"]
    runs.write_manifest(out, identity, args.steps, {"bpb": bpb, "token_unigram_bpb": baseline})
    batch = int(entry._option(args.overrides, "--training.local_batch_size") or config.training.local_batch_size)
    seq_len = int(entry._option(args.overrides, "--training.seq_len") or config.training.seq_len)
    plot_training_curve(out / "metrics.jsonl", out / "training_curve.png", batch * seq_len)
    print(
        f"\ntrained {name} to step {args.steps} ({_count(args.steps - done, 'step')}) in {seconds / 60:.1f} min; "
        f"run folder {out}: checkpoint/, model.pt, tokenizer/, metrics.jsonl, training_curve.png"
    )
    print(
        f"validation ({run.description}, held out; {run.stats['validation_bytes']:,} bytes): {bpb:.3f} bits per "
        f"byte; unigram baselines: tokens {baseline:.3f}, bytes {run.stats['byte_unigram_bpb']:.3f}"
    )
    print("\nsample:\n" + sample(model, run.tokenizer, run.prompt))
    if bpb >= baseline:
        print(
            f"\nexit status 1: validation {bpb:.3f} bits per byte does not beat the token unigram baseline "
            f"{baseline:.3f} (the model predicts no better than token frequencies; train longer with --steps)",
            file=sys.stderr,
        )
        return 1
    return 0


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" + ("" if number == 1 else "s")


def data_main(args: argparse.Namespace) -> int:
    from linrnn.training import data

    root = data.prepare(force=args.force)
    print(json.dumps(data.corpus_stats(), indent=1))
    print(f"prepared in {root}")
    return 0


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
