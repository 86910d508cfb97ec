"""Referee for the model benchmark's repeated-batch losses: is a fast fit memorisation or a look at the future?

In `benchmarks/test_model_gpu.py` every model trains on one fixed batch of uniformly random tokens; after 11 steps
FLA's models reached a loss of ~0.05 and linrnn's 1.2–1.8 (RESULTS.md). On CPU (tiny models, Triton interpreter)
FLA's model was causal and fitted no faster than linrnn's. This repeats the question at the benchmark's scale, on
the GPU, for each model of the benchmark (its builders, bf16 autocast, training mode):

- causality: change the token at position P of one sequence; the logits before P must not move (max |Δ|);
- fit: 11 steps of the benchmark's loop (AdamW 3e-4, clipping at 1.0) on batch A, then the loss on a fresh random
  batch B. Random tokens carry no signal: a causal model cannot beat ln(vocab) ≈ 10.37 on B, whatever it memorised
  of A; a model that sees the next token can.

    python experiments/model_referee.py fla_gdn linrnn_gdn llama [--batch 4 --steps 4096]
    MODEL_BENCH_DEVICE=cpu python experiments/model_referee.py linrnn_gdn --batch 2 --steps 64   # CPU dry run
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import test_model_gpu as bench  # noqa: E402  (the benchmark's builders and config)


def logits(model, ids):
    out = model(input_ids=ids) if not hasattr(model, "readout") else model(ids)
    return out if torch.is_tensor(out) else out.logits


def referee(name: str, batch: int, steps: int, fit_steps: int) -> None:
    torch.manual_seed(0)
    model, loss_fn, _ = bench.build(name, steps)
    model = model.to(bench.DEVICE).train()
    gen = torch.Generator(device=bench.DEVICE).manual_seed(1)
    autocast = torch.autocast(bench.DEVICE, dtype=torch.bfloat16)

    ids = torch.randint(0, bench.VOCAB, (1, steps), device=bench.DEVICE, generator=gen)
    changed, at = ids.clone(), steps * 3 // 4
    changed[0, at] = (ids[0, at] + 1) % bench.VOCAB
    with torch.no_grad(), autocast:
        moved = (logits(model, ids).float() - logits(model, changed).float()).abs().amax(-1)[0]
    print(f"{name}: changing token {at} of {steps} moves the logits before it by {moved[:at].max():.3e}, "
          f"at it by {moved[at]:.3e}")  # fmt: skip

    def batch_of_random_tokens():
        tokens = torch.randint(0, bench.VOCAB, (batch, steps + 1), device=bench.DEVICE, generator=gen)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    inputs, targets = batch_of_random_tokens()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=bench.DEVICE == "cuda")
    losses = []
    for _ in range(fit_steps):
        with autocast:
            loss = loss_fn(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    fresh_inputs, fresh_targets = batch_of_random_tokens()
    with torch.no_grad(), autocast:
        fresh = loss_fn(fresh_inputs, fresh_targets).item()
        again = loss_fn(inputs, targets).item()
    chance = math.log(bench.VOCAB)
    print(f"{name}: fixed batch, {fit_steps} steps: loss {losses[0]:.3f} → {losses[-1]:.3f} (after the last step "
          f"{again:.3f}); a fresh random batch: {fresh:.3f} (ln vocab = {chance:.3f})", flush=True)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("models", nargs="+", help="benchmark model names: linrnn_gdn, fla_gdn, llama, ...")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--steps", type=int, default=4096, help="tokens per sequence")
    parser.add_argument("--fit-steps", type=int, default=11, help="optimizer steps on the fixed batch (default 11)")
    args = parser.parse_args()
    for name in args.models:
        referee(name, args.batch, args.steps, args.fit_steps)
        if bench.DEVICE == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
