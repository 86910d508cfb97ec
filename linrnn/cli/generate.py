"""``linrnn generate CHECKPOINT --prompt TEXT``: streamed sampling from a saved model through ``linrnn.Engine``.

CHECKPOINT is a ``linrnn train`` run folder (``model.pt`` and ``tokenizer/`` in it), a ``model.pt`` from ``linrnn
train`` (the tokenizer in ``tokenizer/`` beside it) or from ``linrnn demo --save`` (byte models: 256 tokens, no
tokenizer), or the folder of an FLA Gated DeltaNet (``save_pretrained``'s, read by ``linrnn.from_fla``; its
``tokenizer.json`` in it). ``--tokenizer DIR`` names another folder with ``tokenizer.json``.

The prompt is echoed (dim on a terminal; ``--no-echo`` leaves it out), then the new text is printed as it is made.
On stderr: one line before the first call (what it prepares: on CUDA, Triton compiles the kernels and the decode
step is captured as a CUDA graph; on the CPU nothing is compiled, but torch imports its compiler modules at the
first custom-op call) and its time after it, then the speed at the end, without the first call. On the CPU,
decoding one sequence uses one thread unless ``--threads N`` or ``OMP_NUM_THREADS`` says otherwise: its matrices
are small, and a second thread costs more in synchronisation than it saves, most of all on a busy machine.
"""

from __future__ import annotations

import argparse
import os
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
from linrnn.training.runs import MANIFEST

EXPECTED = "a model.pt file, a `linrnn train` run folder (model.pt, tokenizer/) or an FLA folder (config.json)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, help="a `linrnn train` run folder, a model.pt (`linrnn train`'s "
                        "or `linrnn demo --save`'s), or an FLA Gated DeltaNet folder (config.json, "
                        "safetensors)")  # fmt: skip
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="a UTF-8 file holding the prompt")
    parser.add_argument("--max-new-tokens", type=positive_int, default=200, help="default 200")
    parser.add_argument("--temperature", type=float_in(0), default=0.8, help="0: greedy (default 0.8)")
    parser.add_argument("--top-k", type=positive_int, help="sample among the k most likely tokens")
    parser.add_argument("--top-p", type=float_in(1e-9, 1), help="sample among the likeliest tokens of mass p")
    parser.add_argument("--seed", type=nonnegative_int, default=0, help="default 0")
    parser.add_argument("--tokenizer", type=Path, help="folder with tokenizer.json (default: the run folder's "
                        "tokenizer/; none for a 256-token byte model)")  # fmt: skip
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="default: cuda when there is one, else cpu")  # fmt: skip
    parser.add_argument("--threads", type=positive_int, help="CPU threads (default: 1 on the CPU unless "
                        "OMP_NUM_THREADS is set: faster for one sequence, most of all on a busy machine)")  # fmt: skip
    parser.add_argument("--no-echo", action="store_true", help="print the new text only, not the prompt before it")


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

    def continuation(self, prompt: list[int], new: list[int]) -> str:
        """The text of ``new`` after ``prompt``: decoded in context (a tokenizer's decoder may drop the leading space
        of a first token), where the prompt's text is a prefix of the whole; else on its own."""
        before, whole = self.decode(prompt), self.decode(prompt + new)
        return whole[len(before) :] if whole.startswith(before) else self.decode(new)

    def stop_tokens(self) -> tuple[int, ...]:
        eos = None if self.tokenizer is None else self.tokenizer.token_to_id(EOS)
        return () if eos is None else (eos,)


def locate(checkpoint: Path) -> tuple[str, Path, Path]:
    """(kind, what to load, the default tokenizer folder) of the checkpoint argument: "model.pt" (a file), "run"
    (a folder with model.pt, as ``linrnn train`` writes it) or "FLA" (a folder with config.json); a ``UsageError``
    for anything else, before anything is read."""
    if checkpoint.is_file():
        return "model.pt", checkpoint, checkpoint.parent / "tokenizer"
    if not checkpoint.is_dir():
        raise UsageError(f"argument checkpoint: expected {EXPECTED}, got {checkpoint} (no such file or folder)")
    if (checkpoint / "model.pt").is_file():
        return "run", checkpoint / "model.pt", checkpoint / "tokenizer"
    if (checkpoint / MANIFEST).is_file():
        raise UsageError(f"argument checkpoint: expected {EXPECTED}, got the run folder {checkpoint} without "
                         f"model.pt (linrnn train writes it when training ends: is it finished?)")  # fmt: skip
    if (checkpoint / "config.json").is_file():
        return "FLA", checkpoint, checkpoint
    raise UsageError(f"argument checkpoint: expected {EXPECTED}, got the folder {checkpoint}, which has neither "
                     f"model.pt nor config.json")  # fmt: skip


def tokenizer_folder(args: argparse.Namespace, beside: Path, vocab_size: int) -> Path | None:
    if args.tokenizer is not None:
        if not (args.tokenizer / "tokenizer.json").is_file():
            raise UsageError(f"argument --tokenizer: expected a folder with tokenizer.json, got {args.tokenizer}")
        return args.tokenizer
    if (beside / "tokenizer.json").is_file():
        return beside
    if vocab_size == 256:
        return None
    where = "in its folder" if beside == args.checkpoint else f"in {beside}"
    raise UsageError(f"argument --tokenizer: the checkpoint's model has {vocab_size} tokens and there is no "
                     f"tokenizer.json {where}; give its tokenizer folder")  # fmt: skip


def read_prompt(args: argparse.Namespace) -> str:
    if args.prompt_file is None:
        try:
            args.prompt.encode("utf-8")
        except UnicodeEncodeError as error:  # bytes the shell passed that are not UTF-8 (kept as surrogates)
            raise UsageError(f"argument --prompt: expected UTF-8 text, got bytes that are not UTF-8 at character "
                             f"{error.start}") from None  # fmt: skip
        return args.prompt
    path = args.prompt_file
    if not path.is_file():
        raise UsageError(f"argument --prompt-file: no such file {path}")
    try:
        data = path.read_bytes()
    except OSError as error:
        raise UsageError(f"argument --prompt-file: cannot read {path}: {error.strerror or error}") from error
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"argument --prompt-file: expected UTF-8 text in {path}, got byte 0x{data[error.start]:02x} "
                         f"at byte offset {error.start} ({error.reason})") from None  # fmt: skip


def set_threads(args: argparse.Namespace, device: torch.device) -> None:
    """``--threads``; else one thread for CPU decoding unless OMP_NUM_THREADS is set (then torch follows it)."""
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    elif device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(1)


def first_call_notice(device: torch.device) -> tuple[str, str]:
    """What the first call prepares on ``device``, and what later calls reuse of it."""
    if device.type == "cuda":
        cache = os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")
        return (f"compiling the Triton kernels of the prefill and the decode step (kept in {cache} for later runs) "
                f"and capturing the decode step as a CUDA graph",
                "later calls reuse the graph, later runs the compiled kernels")  # fmt: skip
    return ("setting up the decode step (torch imports its compiler modules at the first custom-op call; nothing is "
            "compiled on the CPU)", "every run pays it once")  # fmt: skip


def run(args: argparse.Namespace) -> int:
    kind, source, beside = locate(args.checkpoint)
    prompt_text = read_prompt(args)
    try:
        device = torch.device(args.device)
    except RuntimeError as error:
        raise UsageError(
            f"argument --device: expected a torch device such as cpu or cuda, got {args.device!r}"
        ) from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"argument --device: {args.device} asked for, but torch sees no CUDA device")
    model = from_fla(source).to(device) if kind == "FLA" else load_checkpoint(source, map_location=device)
    if device.type == "cuda":
        model = model.to(torch.bfloat16)
    text = Text(tokenizer_folder(args, beside, model.config.vocab_size))
    prompt = text.encode(prompt_text)
    if not prompt:
        raise UsageError("argument --prompt: expected at least one token, got an empty prompt")
    if max(prompt) >= model.config.vocab_size:
        raise UsageError(f"argument --tokenizer: its ids reach {max(prompt)}, the model has "
                         f"{model.config.vocab_size} tokens")  # fmt: skip
    set_threads(args, device)
    sampling = Sampling(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                        top_p=args.top_p, seed=args.seed, stop_tokens=text.stop_tokens())  # fmt: skip
    prompt_ids = torch.tensor(prompt)

    preparing, reused = first_call_notice(device)
    print(f"first call: {preparing} …", file=sys.stderr, flush=True)
    start = time.perf_counter()
    engine = Engine(model, slots=1, max_length=len(prompt) + args.max_new_tokens)  # attention layers' KV cache
    engine.generate([prompt_ids], sampling.model_copy(update={"max_new_tokens": min(2, args.max_new_tokens)}))
    print(f"first call: {time.perf_counter() - start:.1f} s; {reused}", file=sys.stderr, flush=True)

    if not args.no_echo:
        dim = sys.stdout.isatty()
        sys.stdout.write(f"\x1b[2m{prompt_text}\x1b[0m" if dim else prompt_text)
        sys.stdout.flush()
    tokens: list[int] = []
    shown = ""
    start = time.perf_counter()
    for _, token in engine.stream([prompt_ids], sampling):
        tokens.append(token)
        new_text = text.continuation(prompt, tokens)
        if not new_text.endswith("\ufffd"):  # a multi-byte character is printed once complete
            sys.stdout.write(new_text[len(shown) :])
            sys.stdout.flush()
            shown = new_text
    seconds = time.perf_counter() - start
    sys.stdout.write(text.continuation(prompt, tokens)[len(shown) :] + "\n")
    threads = torch.get_num_threads()
    where = f"cpu, {threads} thread{'s' * (threads > 1)}" if device.type == "cpu" else str(device)
    print(f"{len(tokens)} tokens in {seconds:.2f} s ({len(tokens) / max(seconds, 1e-9):.1f} tokens/s, prompt "
          f"{len(prompt)} tokens, {where})", file=sys.stderr)  # fmt: skip
    return 0
