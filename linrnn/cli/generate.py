"""``linrnn generate CHECKPOINT --prompt TEXT``: streamed sampling from a saved model through ``linrnn.Engine``.

The checkpoint is a ``model.pt`` from ``linrnn train`` (its run folder holds the tokenizer in ``tokenizer/``, beside
it) or from ``linrnn demo --save`` (byte models: 256 tokens, no tokenizer), or the folder of an FLA Gated DeltaNet
(``save_pretrained``'s, read by ``linrnn.from_fla``; its ``tokenizer.json`` in it). ``--tokenizer DIR`` names another
folder with ``tokenizer.json``. The new text is printed as it is made; the speed goes to stderr at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from linrnn.cli.arguments import float_in, nonnegative_int, positive_int
from linrnn.errors import UsageError
from linrnn.inference import Engine, Sampling
from linrnn.models import load_checkpoint
from linrnn.models.fla_checkpoints import from_fla
from linrnn.training.data import BOS, EOS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="model.pt from `linrnn train` or `linrnn demo --save`, or an "
                        "FLA Gated DeltaNet folder (config.json, safetensors)")  # fmt: skip
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="a UTF-8 file holding the prompt")
    parser.add_argument("--max-new-tokens", type=positive_int, default=200, help="default 200")
    parser.add_argument("--temperature", type=float_in(0), default=0.8, help="0: greedy (default 0.8)")
    parser.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float_in(1e-9, 1), help="sample among the likeliest tokens of mass p")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="default 0")
    parser.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json (default: tokenizer/ beside "
                        "the checkpoint; none for a 256-token byte model)")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="default: cuda when there is one, else cpu")  # fmt: skip


class Text:
    """Text ↔ token ids: a ``tokenizers`` tokenizer (the prompt starts with ``<s>``; ``</s>`` stops), or bytes."""

    def __init__(self, tokenizer_dir: Path | None):
        self.tokenizer = None
        if tokenizer_dir is not None:
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            return list(text.encode("utf-8"))
        bos = self.tokenizer.token_to_id(BOS)
        ids = self.tokenizer.encode(text, add_special_tokens=False).ids  # <s> once, whatever the post-processor adds
        return ([] if bos is None else [bos]) + ids

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            return bytes(ids).decode("utf-8", errors="replace")
        return self.tokenizer.decode(ids)

    def stop_tokens(self) -> tuple[int, ...]:
        eos = None if self.tokenizer is None else self.tokenizer.token_to_id(EOS)
        return () if eos is None else (eos,)


def tokenizer_folder(args: argparse.Namespace, vocab_size: int) -> Path | None:
    if args.tokenizer is not None:
        if not (args.tokenizer / "tokenizer.json").is_file():
            raise UsageError(f"argument --tokenizer: expected a folder with tokenizer.json, got {args.tokenizer}")
        return args.tokenizer
    beside = args.checkpoint if args.checkpoint.is_dir() else args.checkpoint.parent / "tokenizer"
    if (beside / "tokenizer.json").is_file():
        return beside
    if vocab_size == 256:
        return None
    where = "in its folder" if args.checkpoint.is_dir() else "tokenizer/tokenizer.json beside it"
    raise UsageError(f"argument --tokenizer: the checkpoint's model has {vocab_size} tokens and there is no "
                     f"tokenizer.json {where}; give its tokenizer folder")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if not args.checkpoint.is_file() and not (args.checkpoint / "config.json").is_file():
        raise UsageError(f"argument checkpoint: expected a model.pt file or an FLA folder with config.json, got "
                         f"{args.checkpoint} (no such file)")  # fmt: skip
    if args.prompt_file is not None:
        if not args.prompt_file.is_file():
            raise UsageError(f"argument --prompt-file: no such file {args.prompt_file}")
        prompt_text = args.prompt_file.read_text(encoding="utf-8")
    else:
        prompt_text = args.prompt
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        raise UsageError(
            f"argument --device: expected a torch device such as cpu or cuda, got {args.device!r}"
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"argument --device: {args.device} asked for, but torch sees no CUDA device")
    if args.checkpoint.is_dir():
        model = from_fla(args.checkpoint).to(device)
    else:
        model = load_checkpoint(args.checkpoint, map_location=device)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    text = Text(tokenizer_folder(args, model.config.vocab_size))
    prompt = text.encode(prompt_text)
    if not prompt:
        raise UsageError("argument --prompt: expected at least one token, got an empty prompt")
    if max(prompt) >= model.config.vocab_size:
        raise UsageError(f"argument --tokenizer: its ids reach {max(prompt)}, the model has "
                         f"{model.config.vocab_size} tokens")  # fmt: skip
    sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed, stop_tokens=text.stop_tokens())  # fmt: skip
    engine = Engine(model, slots=1, max_length=len(prompt) + args.max_new_tokens)  # attention layers' KV cache
    tokens: list[int] = []
    shown = ""
    start = time.perf_counter()
    for _, token in engine.stream([torch.tensor(prompt)], sampling):
        tokens.append(token)
        decoded = text.decode(tokens)
        if not decoded.endswith("\ufffd"):  # a multi-byte character is printed once complete
            sys.stdout.write(decoded[len(shown) :])
            sys.stdout.flush()
            shown = decoded
    seconds = time.perf_counter() - start
    sys.stdout.write(text.decode(tokens)[len(shown) :] + "\n")
    print(f"{len(tokens)} tokens in {seconds:.2f} s ({len(tokens) / max(seconds, 1e-9):.1f} tokens/s, prompt "
          f"{len(prompt)} tokens, {device})", file=sys.stderr)  # fmt: skip
    return 0
