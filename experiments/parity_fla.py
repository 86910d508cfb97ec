"""Learning parity with FLA's models (GPU): the same architecture, initial data order, optimizer and schedule for
linrnn's model and FLA 0.6.0's ``GatedDeltaNetForCausalLM`` / ``KDAForCausalLM``, trained on the embedded corpus;
validation loss on the held-out plays every ``--eval-every`` steps, one JSON row per evaluation.

linrnn's model is built from FLA's config (``linrnn.models.fla_checkpoints.config_from_fla``: parameter for
parameter the same model), once per ``conv_init`` ("uniform": PyTorch's Conv1d default; "normal": N(0, init_std²),
FLA's). FLA's gated kernels refuse their backward on Hopper with Triton < 3.7.1 (FLA issue #640); the guard is
lifted here (``TRITON_ABOVE_3_7_1 = True``) and every FLA row says so. ``--probe fixed-batch`` instead repeats one
random batch (the memorisation probe of issue 37) and prints the losses.

    python experiments/parity_fla.py --family gdn --variants linrnn-uniform,linrnn-normal,fla --seeds 0,1,2 \
        --data .data/shakespeare --out parity.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F

FAMILIES = {"gdn": "gated_deltanet", "kda": "kda"}


def fla_config(family: str, args: argparse.Namespace):
    common = dict(hidden_size=args.hidden, num_hidden_layers=args.layers, num_heads=args.heads, head_dim=128,
                  expand_v=2.0 if family == "gdn" else 1.0, intermediate_size=args.mlp, vocab_size=args.vocab,
                  tie_word_embeddings=False, fuse_cross_entropy=False)  # fmt: skip
    if family == "gdn":
        from fla.models import GatedDeltaNetConfig

        return GatedDeltaNetConfig(**common)
    from fla.models import KDAConfig

    return KDAConfig(**common)


def build(family: str, variant: str, args: argparse.Namespace, seed: int):
    """(model on the GPU, loss function of a [B, T + 1] token batch, note)."""
    torch.manual_seed(seed)
    config = fla_config(family, args)
    if variant == "fla":
        import fla.ops.common.chunk_o as chunk_o
        from fla.models import GatedDeltaNetForCausalLM, KDAForCausalLM

        chunk_o.TRITON_ABOVE_3_7_1 = True
        model = (GatedDeltaNetForCausalLM if family == "gdn" else KDAForCausalLM)(config).to(args.device)

        def loss(x):
            logits = model(input_ids=x[:, :-1]).logits
            return F.cross_entropy(logits.float().flatten(0, 1), x[:, 1:].flatten())

        return model, loss, "FLA 0.6.0 kernels, Hopper backward guard lifted (FLA issue #640)"
    from linrnn.models import LanguageModel
    from linrnn.models.fla_checkpoints import config_from_fla

    ours = config_from_fla(config.to_dict(), intermediate_size=args.mlp)
    ours = ours.model_copy(update={"conv_init": variant.removeprefix("linrnn-")})
    model = LanguageModel(ours).to(args.device)
    return model, lambda x: model.loss(x[:, :-1], x[:, 1:]), f"linrnn conv_init={ours.conv_init}"


def token_stream(folder: Path, split: str, tokenizer) -> torch.Tensor:
    ids: list[int] = []
    bos, eos = tokenizer.token_to_id("<s>"), tokenizer.token_to_id("</s>")
    for line in (folder / f"{split}.jsonl").read_text().splitlines():
        ids += [bos, *tokenizer.encode(json.loads(line)["text"]).ids, eos]
    return torch.tensor(ids)


def train(family, variant, seed, args, train_ids, valid_windows, bytes_per_token, log):
    model, loss_of, note = build(family, variant, args, seed)
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.1,
                                  fused=args.device == "cuda")  # fmt: skip
    warmup = max(1, args.steps // 10)
    def multiplier(step: int) -> float:  # linear warmup, then cosine from 1 to 0.1
        cosine = 0.1 + 0.45 * (1 + math.cos(math.pi * min(step, args.steps) / args.steps))
        return min(1.0, (step + 1) / warmup) * cosine

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, multiplier)
    order = torch.Generator().manual_seed(1000 + seed)  # the data order depends on the seed only, not on the model
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        if args.probe == "fixed-batch":
            x = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1), generator=torch.Generator().manual_seed(7))
        else:
            offsets = torch.randint(0, len(train_ids) - args.seq_len - 1, (args.batch,), generator=order)
            x = torch.stack([train_ids[o : o + args.seq_len + 1] for o in offsets.tolist()])
        with torch.autocast(args.device, dtype=torch.bfloat16):
            loss = loss_of(x.to(args.device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        if step % args.eval_every == 0 or step == args.steps:
            row = dict(family=family, variant=variant, seed=seed, step=step, tokens=step * args.batch * args.seq_len,
                       train_loss=round(loss.item(), 4), params=params, note=note,
                       seconds=round(time.perf_counter() - start, 1))  # fmt: skip
            if args.probe != "fixed-batch":
                model.eval()
                with torch.no_grad(), torch.autocast(args.device, dtype=torch.bfloat16):
                    total = sum(loss_of(w.to(args.device)).item() for w in valid_windows.split(args.batch)) * args.batch
                model.train()
                valid = total / len(valid_windows)  # equal-size batches but the last; close enough, same for all
                row |= dict(valid_loss=round(valid, 4), valid_bpb=round(valid / math.log(2) / bytes_per_token, 4))
            log(row)
    del model, optimizer
    if args.device == "cuda":
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", choices=FAMILIES, required=True)
    parser.add_argument("--variants", default="linrnn-uniform,linrnn-normal,fla")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--mlp", type=int, default=1536)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--eval-every", type=int, default=50)
    parser.add_argument("--probe", choices=["fixed-batch"], default=None)
    parser.add_argument("--data", type=Path, default=Path(".data/shakespeare"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(args.data / f"tokenizer-{args.vocab}" / "tokenizer.json"))
    train_ids = token_stream(args.data, "train", tokenizer)
    valid_ids = token_stream(args.data, "validation", tokenizer)
    valid_bytes = sum(len(json.loads(line)["text"].encode()) for line in (args.data / "validation.jsonl").open())
    bytes_per_token = valid_bytes / len(valid_ids)
    width = args.seq_len + 1
    valid_windows = valid_ids[: len(valid_ids) // width * width].view(-1, width)

    def log(row):
        print(json.dumps(row), flush=True)
        with args.out.open("a") as file:
            file.write(json.dumps(row) + "\n")

    for seed in map(int, args.seeds.split(",")):
        for variant in args.variants.split(","):
            train(args.family, variant, seed, args, train_ids, valid_windows, bytes_per_token, log)


if __name__ == "__main__":
    main()
