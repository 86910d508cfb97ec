"""``linrnn export RUN_FOLDER OUT``: a ``linrnn train`` run folder (or an FLA Gated DeltaNet folder) → a Hugging Face
folder that ``transformers.AutoModelForCausalLM.from_pretrained(OUT)`` (after ``import linrnn``) and
``LanguageModel.from_pretrained(OUT)`` read: config.json (model_type "linrnn"), model.safetensors and the
tokenizer's files (``LanguageModel.save_pretrained``), whose template starts a text with BOS, as linrnn train
starts its documents.

The run folder is read as ``linrnn eval`` reads it (``linrnn.evaluation.checkpoints``: only with linrnn's manifest;
``model.pt`` tensors only). OUT must be new or empty: nothing is overwritten.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import torch

from linrnn.errors import UsageError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_folder", type=Path, metavar="RUN_FOLDER", help="a linrnn train run folder "
                        "(linrnn-run.json, model.pt, tokenizer/), or an FLA folder")  # fmt: skip
    parser.add_argument("out", type=Path, metavar="OUT", help="the Hugging Face folder to write (new or empty)")
    parser.add_argument("--dtype", default="float32", help="the weights' dtype: float32 (default), bfloat16, float16")


def run(args: argparse.Namespace) -> int:
    from linrnn.evaluation import checkpoints

    dtype = checkpoints.parse_dtype(args.dtype, "argument --dtype")
    out = args.out
    if out.exists() and not out.is_dir():
        raise UsageError(f"argument OUT: expected a new or empty folder, got the file {out}")
    if out.is_dir() and any(out.iterdir()):
        raise UsageError(f"argument OUT: expected a new or empty folder, got {out}, which holds files "
                         f"(nothing is overwritten)")  # fmt: skip
    kind = checkpoints.check_folder(args.run_folder, "argument RUN_FOLDER")  # before anything is loaded
    found = checkpoints.load(args.run_folder, "argument RUN_FOLDER", torch.device("cpu"), dtype)
    tokenizer = args.run_folder / "tokenizer" if kind == "linrnn run" else args.run_folder
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.parent / f".{out.name}.partial-{os.getpid()}"  # OUT appears whole or not at all
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    try:
        found.model.save_pretrained(partial, tokenizer=tokenizer)
        _start_documents_with_bos(partial / "tokenizer.json", found.tokens.bos)
        if out.is_dir():
            out.rmdir()  # empty, checked above
        partial.rename(out)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    files = ", ".join(sorted(path.name for path in out.iterdir()))
    print(f"wrote {out} ({files}) from the {kind} folder {args.run_folder}: {found.model.num_parameters():,} "
          f"parameters in {args.dtype}; read it with transformers.AutoModelForCausalLM.from_pretrained after "
          f"import linrnn, or linrnn.models.LanguageModel.from_pretrained")  # fmt: skip
    return 0


def _start_documents_with_bos(file: Path, bos: int | None) -> None:
    """linrnn train starts each document with BOS, its tokenizer's template adds nothing: a template that adds BOS
    makes transformers' tokenizer (``tokenizer(text)``, pipelines) give what the model was trained on. A tokenizer
    with a template of its own (FLA's) keeps it; linrnn's readers encode without the template."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(str(file))
    if bos is None or tokenizer.post_processor is not None:
        return
    name = tokenizer.id_to_token(bos)
    tokenizer.post_processor = processors.TemplateProcessing(single=f"{name} $A", pair=f"{name} $A {name} $B",
                                                             special_tokens=[(name, bos)])  # fmt: skip
    tokenizer.save(str(file))
