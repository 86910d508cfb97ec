"""Trained models to evaluate: a ``linrnn train`` run folder or an FLA folder → the model and its tokenizer.

A run folder is opened only when it holds linrnn's manifest (``linrnn-run.json``, ``linrnn.training.runs``), then
its ``model.pt`` (``linrnn.models.load_checkpoint``, tensors only) and ``tokenizer/tokenizer.json``. An FLA folder
is ``config.json`` with safetensors (``linrnn.models.fla_checkpoints.from_fla``) and ``tokenizer.json`` beside
them. Nothing else is opened: a folder with a ``model.pt`` but no manifest is refused unread. Errors are
``UsageError``s that start with ``argument``, the name of the argument as the caller's user wrote it
("argument RUN_FOLDER", "model_args pretrained").

Documents are tokenized as ``linrnn train`` tokenizes them: ``<s>`` (the tokenizer's ``bos_token``) then the
text's tokens, without the tokenizer's own special-token template.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch

from linrnn.errors import UsageError
from linrnn.models import LanguageModel, load_checkpoint
from linrnn.training import runs

EXPECTED = (
    "a linrnn run folder (linrnn-run.json, model.pt, tokenizer/tokenizer.json) or an FLA folder (config.json, "
    "model.safetensors, tokenizer.json)"
)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Tokens:
    """Text ↔ token ids with a ``tokenizers`` tokenizer; ``bos`` starts a document, ``eos`` ends one (None: the
    tokenizer has no such token)."""

    tokenizer: object  # tokenizers.Tokenizer
    bos: int | None
    eos: int | None

    @property
    def prefix(self) -> int:
        """The token a document's first token is predicted from: BOS, else EOS (as the end of a previous one)."""
        return self.bos if self.bos is not None else self.eos

    @classmethod
    def from_folder(cls, folder: Path) -> Tokens:
        """``folder/tokenizer.json``; BOS and EOS named by ``tokenizer_config.json`` if there, else ``<s>``,
        ``</s>``."""
        from tokenizers import Tokenizer

        from linrnn.training.data import BOS, EOS

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config_file = folder / "tokenizer_config.json"
        config = json.loads(config_file.read_text()) if config_file.is_file() else {}

        def token_id(key: str, default: str) -> int | None:
            name = config.get(key) or default
            if isinstance(name, dict):  # transformers' AddedToken form, {"content": "<s>", ...}
                name = name.get("content", default)
            return tokenizer.token_to_id(name)

        return cls(tokenizer, token_id("bos_token", BOS), token_id("eos_token", EOS))

    def encode(self, text: str) -> list[int]:
        """The text's tokens, no BOS or EOS."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def token_bytes(self, ids: list[int]) -> list[int]:
        """The UTF-8 bytes each token decodes to, in order: a token that ends a character split across tokens
        counts the whole character, the tokens before it 0 (``tokenizers``' streaming decoder), so the counts sum
        to the decoded text's bytes."""
        from tokenizers.decoders import DecodeStream

        stream = DecodeStream(skip_special_tokens=False)
        return [len((stream.step(self.tokenizer, token) or "").encode()) for token in ids]


@dataclass
class Checkpoint:
    model: LanguageModel
    tokens: Tokens
    folder: Path
    kind: str  # "linrnn run" or "FLA"
    config: str  # the run's config name, or FLA's model_type
    training_seq_len: int | None  # tokens per training sequence, where the run folder says


def check_folder(folder: Path, argument: str) -> str:
    """The kind of ``folder``, "linrnn run" or "FLA", from the files it holds; a ``UsageError`` if it is
    neither, before anything in it is loaded."""
    if not folder.is_dir():
        raise UsageError(f"{argument}: expected {EXPECTED}, got {folder} (no such folder)")
    if (folder / runs.MANIFEST).is_file():
        _manifest(folder, argument)
        for needed in ("model.pt", "tokenizer/tokenizer.json"):
            if not (folder / needed).is_file():
                raise UsageError(
                    f"{argument}: expected {EXPECTED}, got the run folder {folder} without {needed} "
                    f"(is its training finished?)"
                )
        return "linrnn run"
    if (folder / "config.json").is_file():
        if not (folder / "tokenizer.json").is_file():
            raise UsageError(f"{argument}: expected {EXPECTED}, got the FLA folder {folder} without "
                             f"tokenizer.json")  # fmt: skip
        return "FLA"
    raise UsageError(
        f"{argument}: expected {EXPECTED}, got {folder}, which has neither {runs.MANIFEST} nor "
        f"config.json; linrnn opens checkpoints only from folders that say what they are"
    )


def load(folder: Path, argument: str, device: torch.device, dtype: torch.dtype = torch.float32) -> Checkpoint:
    """The model (in eval mode, on ``device`` in ``dtype``) and tokenizer of a run folder or an FLA folder."""
    from linrnn.models.fla_checkpoints import from_fla

    kind = check_folder(folder, argument)
    tokens = Tokens.from_folder(folder / "tokenizer" if kind == "linrnn run" else folder)
    if tokens.prefix is None:
        raise UsageError(f"{argument}: {folder}'s tokenizer has neither a BOS nor an EOS token "
                         f"(tokenizer_config.json's bos_token or eos_token, or <s>, </s>) to start documents "
                         f"with")  # fmt: skip
    if kind == "linrnn run":
        manifest = _manifest(folder, argument)
        model = load_checkpoint(folder / "model.pt", map_location="cpu")
        config = manifest["identity"]["config"]
        seq_len = _training_seq_len(config, manifest["identity"]["overrides"])
    else:
        model = from_fla(folder)
        config = str(json.loads((folder / "config.json").read_text()).get("model_type"))
        seq_len = None
    vocab = tokens.tokenizer.get_vocab_size()
    if vocab > model.config.vocab_size:
        raise UsageError(f"{argument}: {folder}'s tokenizer has {vocab} tokens, more than its model's "
                         f"{model.config.vocab_size}")  # fmt: skip
    return Checkpoint(model.to(device, dtype).eval(), tokens, folder, kind, config, seq_len)


def _manifest(folder: Path, argument: str) -> dict:
    path = folder / runs.MANIFEST
    try:
        manifest = json.loads(path.read_text())
        runs.identity_of(manifest)  # the fields must be there
    except (ValueError, KeyError, TypeError) as error:
        raise UsageError(f"{argument}: {path} is not a linrnn run manifest ({error})") from error
    return manifest


def _training_seq_len(config: str, overrides: list[str]) -> int | None:
    """The training sequence length of a named config, or of its ``--training.seq_len`` override."""
    from linrnn.training import names
    from linrnn.training.launch import flag_value

    given = flag_value(list(overrides), "--training.seq_len")
    if given is not None:
        return int(given)
    parsed = names.parse_config_name(config)
    return None if parsed is None else names.SIZES[parsed[1]].seq_len


def parse_device(text: str | None, argument: str) -> torch.device:
    """``text`` as a torch device (None: cuda when there is one, else cpu); a ``UsageError`` if it is not one."""
    if text is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except RuntimeError as error:
        raise UsageError(f"{argument}: expected a torch device such as cpu or cuda, got {text!r}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"{argument}: {text} asked for, but torch sees no CUDA device")
    return device


def parse_dtype(text: str, argument: str) -> torch.dtype:
    if text not in DTYPES:
        raise UsageError(f"{argument}: expected one of {', '.join(DTYPES)}, got {text!r}")
    return DTYPES[text]
