"""How fast sweep runs are on this device: tokens/s per width for one process, then the wall time of 4 runs per
width with 1 and several processes sharing the device (experiments/gpu_sweep.sh probe; MPS=1 there starts the CUDA
MPS daemon first, so the processes' kernels can run concurrently).

    python experiments/sweep_probe.py [--single] [--widths 128 1024] [--workers 1 3] [--steps 60]
"""

import argparse
import tempfile
import time
from pathlib import Path

import torch

from linrnn.training.sweep import Corpus, Run, SweepConfig, run_sweep, train_run


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--single", action="store_true", help="first time one process per width (sp, gdn-mup)")
    parser.add_argument("--widths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    config = SweepConfig(steps=args.steps, validation_batches=4)
    if args.single:
        corpus = Corpus(config)
        for width in config.widths:
            for param in ("sp", "gdn-mup"):
                run = Run(cell="gated_deltanet", optimizer="adamw", parametrization=param, width=width, lr=3e-3)
                start = time.perf_counter()
                train_run(config, run, corpus, torch.device("cuda"))  # compile and autotune
                print(f"width {width} {param}: first run {time.perf_counter() - start:.1f} s", flush=True)
                row = train_run(config, run, corpus, torch.device("cuda"))
                print(
                    f"width {width} {param}: {row['tokens_per_second']:,} tokens/s, loss {row['train_loss']:.3f}, "
                    f"{row['parameters'] / 1e6:.1f}M parameters, {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB",
                    flush=True,
                )
    for width in args.widths:
        small = config.model_copy(
            update={
                "widths": [width],
                "parametrizations": ["sp"],
                "optimizers": ["adamw"],
                "lrs": {"adamw": [1e-3, 2e-3, 3e-3, 4e-3], "sgd": [0.1]},
            }
        )
        for workers in args.workers:
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
