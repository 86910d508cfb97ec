"""Greedy tokens of a trained model decoded with bf16 recurrent states (``Engine(state_dtype=torch.bfloat16)``)
against the fp32 states: the fraction of equal tokens and where each sequence first differs. The benchmark's
``test_bf16_state_agreement`` does the same on a 340M model with random weights, whose near-flat logits make greedy
decoding diverge at the first rounding; a trained model's logits have real gaps.

    python experiments/bf16_state_agreement.py outputs/gdn_tiny_sp --prompts 8 --prompt-tokens 256 --new 1024

Prompts are the first ``--prompt-tokens`` tokens of held-out passages of the embedded corpus (``linrnn data
prepare``), read with the run's tokenizer. CPU by default (``--device cuda`` on a GPU).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import linrnn
from linrnn.evaluation.checkpoints import load
from linrnn.training import data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a linrnn train run folder")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=256)
    parser.add_argument("--new", type=int, default=1024)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    torch.set_num_threads(1)
    checkpoint = load(args.run, "run", torch.device(args.device))
    passages = [json.loads(line)["text"] for line in (data.corpus_dir() / "validation.jsonl").read_text().splitlines()]
    prompts = []
    for text in passages:
        ids = checkpoint.tokens.tokenizer.encode(text).ids
        if len(ids) >= args.prompt_tokens:
            prompts.append(torch.tensor(ids[: args.prompt_tokens], device=args.device))
        if len(prompts) == args.prompts:
            break
    greedy = linrnn.Sampling(max_new_tokens=args.new, temperature=0)
    with torch.no_grad():
        runs = {
            name: [r.tokens for r in linrnn.Engine(checkpoint.model, slots=len(prompts), state_dtype=dtype)
                   .generate(prompts, greedy)]
            for name, dtype in (("fp32", None), ("bf16", torch.bfloat16))
        }  # fmt: skip
    pairs = list(zip(runs["fp32"], runs["bf16"], strict=True))
    equal = sum(a == b for x, y in pairs for a, b in zip(x, y, strict=True))
    first = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x)) for x, y in pairs]
    print(f"{args.run}: {len(prompts)} held-out prompts of {args.prompt_tokens} tokens, {args.new} greedy tokens "
          f"each: {equal / (len(prompts) * args.new):.1%} of tokens equal with bf16 states; first difference per "
          f"sequence at {first}")  # fmt: skip


if __name__ == "__main__":
    main()
