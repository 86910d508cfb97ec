"""After training: load a torchtitan checkpoint into a ``LanguageModel``, measure validation bits per byte on
the whole held-out set, and sample text. Also the ``linrnn train`` main job and ``linrnn data prepare``."""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from linrnn import parametrizations
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
    dcp.load(state, checkpoint_id=str(checkpoint_dir), no_dist=True)
    model.load_state_dict({name.removeprefix("model."): tensor for name, tensor in state.items()})
    return model.eval()


def latest_checkpoint(dump_folder: str | Path) -> Path:
    steps = sorted(Path(dump_folder, "checkpoint").glob("step-*"), key=lambda p: int(p.name.split("-")[1]))
    if not steps:
        raise FileNotFoundError(f"no checkpoint under {dump_folder}/checkpoint")
    return steps[-1]


@torch.no_grad()
def validation_bpb(
    model: LanguageModel, tokenizer_folder: str | Path, documents_file: str | Path, seq_len: int = 1024
) -> tuple[float, int]:
    """(bits per byte, bytes) of ``documents_file`` (jsonl, ``text``): each document is ``<s> text </s>``, its
    targets are every token after ``<s>``, documents are packed into rows of ``seq_len`` with their positions."""
    from tokenizers import Tokenizer

    from linrnn.training.data import BOS, EOS

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_folder) / "tokenizer.json"))
    bos, eos = tokenizer.token_to_id(BOS), tokenizer.token_to_id(EOS)
    ids, positions, byte_count = [], [], 0
    for line in Path(documents_file).read_text().splitlines():
        text = json.loads(line)["text"]
        byte_count += len(text.encode())
        tokens = [bos, *tokenizer.encode(text).ids, eos]
        for start in range(0, len(tokens) - 1, seq_len):  # a document longer than a row continues in the next
            piece = tokens[start : start + seq_len + 1]
            ids.append(piece)
            positions.append(list(range(len(piece) - 1)))
    nats = 0.0
    device = next(model.parameters()).device
    for piece, pos in zip(ids, positions, strict=True):
        inputs = torch.tensor([piece[:-1]], device=device)
        logits = model(inputs, positions=torch.tensor([pos], device=device)).float()
        nats += float(F.cross_entropy(logits[0], torch.tensor(piece[1:], device=device), reduction="sum"))
    return nats / math.log(2) / byte_count, byte_count


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
    parser.add_argument("--cell", default="gdn", help="gla, deltanet, gdn, kda or gammanet (default gdn)")
    parser.add_argument("--size", default="tiny", help="a size of linrnn.training.configs (default tiny)")
    parser.add_argument("--param", default="sp", help="sp, mup or gdnmup (default sp)")
    parser.add_argument("--steps", type=int, default=250, help="training steps (default 250, ~4 min on 2 CPU cores)")
    parser.add_argument(
        "--out", default="outputs/linrnn-train", help="run folder (checkpoints, metrics.jsonl, model.pt)"
    )
    parser.add_argument("overrides", nargs="*", help="further torchtitan flags after --, e.g. -- --optimizer.lr 1e-3")


def train_main(args: argparse.Namespace) -> int:
    """The README's main job: prepare the corpus, train, report validation bpb and a sample."""
    from linrnn import train as entry
    from linrnn.training import compat, data

    compat.install()
    from linrnn.training import configs

    name = f"{args.cell}_{args.size}_{args.param}"
    if name not in configs.config_names():
        raise SystemExit(
            f"linrnn train: no config {name!r}: cell in {list(configs.CELLS)}, size in "
            f"{list(configs.SIZES)}, param in {list(configs.PARAMETRIZATIONS)}"
        )
    data.prepare()
    started = time.perf_counter()
    entry.main(
        [
            "--config",
            name,
            "--training.steps",
            str(args.steps),
            "--dump_folder",
            args.out,
            "--metrics.log_freq",
            "25",
            "--validator.freq",
            "125",
            *args.overrides,
        ]
    )
    seconds = time.perf_counter() - started
    config = configs.build(configs.CELLS[args.cell], args.size, configs.PARAMETRIZATIONS[args.param])
    model = load_trained(config, latest_checkpoint(args.out))
    save_checkpoint(model, Path(args.out) / "model.pt")
    tokenizer = config.hf_assets_path
    bpb, count = validation_bpb(model, tokenizer, data.corpus_dir() / "validation.jsonl")
    stats = data.corpus_stats()
    unigram = stats["tokenizers"][str(configs.SIZES[args.size].vocab)]["token_unigram_bpb"]
    print(
        f"\ntrained {name} for {args.steps} steps in {seconds / 60:.1f} min; checkpoints in {args.out}/checkpoint, "
        f"the model in {args.out}/model.pt"
    )
    print(
        f"validation ({', '.join(stats['validation_works'])}; {count:,} bytes): {bpb:.3f} bits per byte; "
        f"unigram baselines: tokens {unigram:.3f}, bytes {stats['byte_unigram_bpb']:.3f}"
    )
    print("\nsample:\n" + sample(model, tokenizer, "ROMEO.\n"))
    return 0 if bpb < unigram else 1


def data_main(args: argparse.Namespace) -> int:
    from linrnn.training import data

    root = data.prepare(force=args.force)
    print(json.dumps(data.corpus_stats(), indent=1))
    print(f"prepared in {root}")
    return 0
