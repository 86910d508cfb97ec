"""How fast sweep runs are on this device: tokens/s per width for one process, then the wall time of 4 runs at
the small widths with 1 and 4 processes sharing the device (scripts/gpu_sweep.sh probe)."""

import tempfile
import time
from pathlib import Path

import torch

from linrnn.training.sweep import Corpus, Run, SweepConfig, run_sweep, train_run


def main() -> None:
    config = SweepConfig(steps=60, validation_batches=4)
    corpus = Corpus(config)
    device = torch.device("cuda")
    for width in config.widths:
        for param in ("sp", "gdn-mup"):
            run = Run(cell="gated_deltanet", optimizer="adamw", parametrization=param, width=width, lr=3e-3)
            start = time.perf_counter()
            train_run(config, run, corpus, device)  # compile and autotune
            print(f"width {width} {param}: first run {time.perf_counter() - start:.1f} s", flush=True)
            row = train_run(config, run, corpus, device)
            print(
                f"width {width} {param}: {row['tokens_per_second']:,} tokens/s, loss {row['train_loss']:.3f}, "
                f"{row['parameters'] / 1e6:.1f}M parameters, {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
                flush=True,
            )
    for width in (128, 512):
        small = config.model_copy(
            update={
                "widths": [width],
                "parametrizations": ["sp"],
                "optimizers": ["adamw"],
                "lrs": {"adamw": [1e-3, 2e-3, 3e-3, 4e-3], "sgd": [0.1]},
            }
        )
        for workers in (1, 4):
            with tempfile.TemporaryDirectory() as folder:
                start = time.perf_counter()
                run_sweep(small, Path(folder) / "t.jsonl", workers=workers)
                print(
                    f"width {width}: 4 runs × {config.tokens_per_run:,} tokens with {workers} process(es): "
                    f"{time.perf_counter() - start:.1f} s",
                    flush=True,
                )


if __name__ == "__main__":  # worker processes are spawned and import this file
    main()
