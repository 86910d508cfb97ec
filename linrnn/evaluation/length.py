"""What ``linrnn eval length`` computes: loss by token position of trained models on documents longer than their
training length (the command line is ``linrnn.cli.evaluation``).

Each model reads each document whole, ``<s>`` then its tokens (cut to ``--max-tokens`` if given; the output names
the documents that were cut), in one pass with the recurrent state carried between pieces
(``linrnn.evaluation.scoring``). The loss of the token at position p (0: the first token after ``<s>``) goes to
the bucket holding p: [0, 64), [64, 128), [128, 256), ..., doubling up to the longest document. A bucket's bits per
byte are its tokens' losses in bits over the UTF-8 bytes those tokens decode to (``Tokens.token_bytes``): the
measure ``linrnn train`` reports on its whole held-out set (``linrnn.training.job.validation_bpb``, which also
scores ``</s>``), here by position, so models with different tokenizers compare. Positions are in each model's
own tokens, so the same bucket covers more text under a coarser tokenizer; the JSON has each bucket's bytes.
The last buckets hold only the documents long enough to reach them.

The documents: ``--data FILE ...`` (UTF-8 text, a file per document), else the embedded corpus's held-out plays,
the works ``linrnn train`` validates on (``linrnn.training.data``: every tenth work by name, stored as passages of
about 4 kB), each put back together whole from its passages.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from linrnn.errors import UsageError
from linrnn.evaluation import checkpoints
from linrnn.evaluation.scoring import target_log_probs

FIRST_BUCKET = 64  # tokens in the first bucket, [0, 64); each later bucket doubles
LN2 = math.log(2)


@dataclass
class Document:
    name: str
    text: str


@dataclass
class Bucket:
    """Token positions [start, end) of every document together."""

    start: int
    end: int
    tokens: int
    bytes: int
    bits: float

    @property
    def bits_per_byte(self) -> float:
        return self.bits / self.bytes if self.bytes else math.nan


@dataclass
class Scored:
    """One document under one model: the loss in bits and the bytes of each token, by position ``[n]``."""

    name: str
    bits: torch.Tensor  # float64
    bytes: torch.Tensor  # int64
    tokens_before_cut: int


def model_labels(folders: list[Path], labels: list[str] | None) -> list[str]:
    """The given labels (one per folder, distinct), else the folder names (the paths as given where two share one)."""
    if labels is not None:
        if len(labels) != len(folders):
            raise UsageError(f"argument --labels: expected one per RUN_FOLDER ({len(folders)}), got {len(labels)}")
        if len(set(labels)) != len(labels):
            raise UsageError(f"argument --labels: expected distinct names, got {labels}")
        return labels
    names = [folder.resolve().name for folder in folders]
    return names if len(set(names)) == len(names) else [str(folder) for folder in folders]


def read_files(paths: list[Path]) -> list[Document]:
    documents = []
    for path in paths:
        if not path.is_file():
            raise UsageError(f"argument --data: expected a UTF-8 text file, got {path} (no such file)")
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as error:
            raise UsageError(f"argument --data: expected UTF-8 text, got {path}, whose byte {error.start} is not "
                             f"UTF-8 ({error.reason})") from None  # fmt: skip
        if not text:
            raise UsageError(f"argument --data: expected a document with text, got the empty file {path}")
        documents.append(Document(path.name, text))
    return documents


def held_out_plays(console: Console) -> list[Document]:
    """The embedded corpus's held-out works (prepared first if need be), each whole: its passages in order,
    joined by the blank lines they were cut at."""
    from linrnn.training import data

    root = data.prepare(vocab_sizes=(), log=console.print)
    works: dict[str, list[str]] = {}
    for line in (root / "validation.jsonl").read_text().splitlines():  # in order within each work (not shuffled)
        record = json.loads(line)
        works.setdefault(record["work"], []).append(record["text"])
    return [Document(work, "\n\n".join(passages)) for work, passages in works.items()]


def score_document(checkpoint: checkpoints.Checkpoint, document: Document, max_tokens: int | None) -> Scored:
    """Bits and bytes per token of ``document``'s first ``max_tokens`` tokens (all if None), read after the
    prefix token in one pass."""
    ids = checkpoint.tokens.encode(document.text)
    kept = ids[:max_tokens]
    device = next(checkpoint.model.parameters()).device
    sequence = torch.tensor([[checkpoint.tokens.prefix, *kept]], device=device)
    log_probs, _ = target_log_probs(checkpoint.model, sequence)
    bits = -log_probs[0].double().cpu() / LN2
    byte_counts = torch.tensor(checkpoint.tokens.token_bytes(kept), dtype=torch.long)
    return Scored(document.name, bits, byte_counts, len(ids))


def bucket_edges(length: int, first: int = FIRST_BUCKET) -> list[int]:
    """Edges of the buckets covering token positions [0, length): 0, first, 2·first, 4·first, ..., length."""
    edges = [0]
    while edges[-1] < length:
        edges.append(min(length, max(first, 2 * edges[-1])))
    return edges


def buckets(scored: list[Scored], edges: list[int]) -> list[Bucket]:
    """The non-empty buckets of ``edges`` over every document's tokens."""
    found = []
    for start, end in zip(edges, edges[1:], strict=False):
        pieces = [(s.bits[start:end], s.bytes[start:end]) for s in scored if len(s.bits) > start]
        if pieces:
            tokens = sum(len(bits) for bits, _ in pieces)
            byte_count = sum(int(counts.sum()) for _, counts in pieces)
            found.append(Bucket(start, end, tokens, byte_count, sum(float(bits.sum()) for bits, _ in pieces)))
    return found


def describe_checkpoint(checkpoint: checkpoints.Checkpoint) -> dict:
    return {"folder": str(checkpoint.folder), "kind": checkpoint.kind, "config": checkpoint.config,
            "training_seq_len": checkpoint.training_seq_len}  # fmt: skip


def model_report(label: str, about: dict, scored: list[Scored], edges: list[int]) -> dict:
    """One model's numbers: ``about`` (``describe_checkpoint``), totals, per document and per bucket."""
    total_bits = sum(float(s.bits.sum()) for s in scored)
    total_bytes = sum(int(s.bytes.sum()) for s in scored)
    return {
        "label": label,
        **about,
        "tokens": sum(len(s.bits) for s in scored),
        "bytes": total_bytes,
        "bits_per_byte": total_bits / total_bytes,
        "documents": [
            {
                "name": s.name,
                "tokens": len(s.bits),
                "tokens_before_cut": s.tokens_before_cut,
                "cut": len(s.bits) < s.tokens_before_cut,
                "bits_per_byte": float(s.bits.sum()) / int(s.bytes.sum()),
            }
            for s in scored
        ],
        "buckets": [asdict(bucket) | {"bits_per_byte": bucket.bits_per_byte} for bucket in buckets(scored, edges)],
    }


def results_table(report: dict, edges: list[int]) -> Table:
    """A row per bucket of ``edges``, a column per model, and the totals."""
    table = Table()
    table.add_column("token positions")
    for model in report["models"]:
        seq_len = model["training_seq_len"]
        table.add_column(model["label"] + (f"\n(trained on {seq_len} tokens)" if seq_len else ""), justify="right")
    for start, end in zip(edges, edges[1:], strict=False):
        cells = []
        for model in report["models"]:
            found = [b for b in model["buckets"] if b["start"] == start]
            cells.append(f"{found[0]['bits_per_byte']:.3f}" if found else "–")
        table.add_row(f"[{start:,}, {end:,})", *cells)
    table.add_row("all", *(f"{model['bits_per_byte']:.3f}" for model in report["models"]), style="bold")
    return table


def plot(report: dict, path: Path) -> None:
    """One line per model: bits per byte against the bucket's position (geometric middle, log2 axis); a dotted
    line at each model's training length where known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5))
    for model in report["models"]:
        middles = [math.sqrt(max(b["start"], 1) * b["end"]) for b in model["buckets"]]
        (line,) = axes.plot(middles, [b["bits_per_byte"] for b in model["buckets"]], "o-", label=model["label"])
        if model["training_seq_len"]:
            axes.axvline(model["training_seq_len"], color=line.get_color(), linestyle=":", linewidth=1)
    axes.set_xscale("log", base=2)
    cut = f", first {report['max_tokens']:,} tokens" if report["max_tokens"] else ""
    axes.set(xlabel="token position (bucket middle; dotted: training length)", ylabel="bits per byte",
             title=f"loss by position: {len(report['documents'])} documents{cut}")  # fmt: skip
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)
