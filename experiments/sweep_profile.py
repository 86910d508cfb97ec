"""Where a sweep step's time goes on this device: torch.profiler over a short run per width, the ops with the most
host (self CPU) time, and the device's busy time against the wall time (experiments/gpu_sweep.sh profile)."""

import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

from linrnn.training.sweep import Corpus, Run, SweepConfig, train_run


def main(widths: list[int]) -> None:
    config = SweepConfig(steps=20, validation_batches=1)
    corpus = Corpus(config)
    device = torch.device("cuda")
    for width in widths:
        run = Run(cell="gated_deltanet", optimizer="adamw", parametrization="gdn-mup", width=width, lr=3e-3)
        train_run(config, run, corpus, device)  # compile and autotune
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            row = train_run(config, run, corpus, device)
            torch.cuda.synchronize()
            wall = time.perf_counter() - start
        events = prof.key_averages()
        busy = sum(e.self_device_time_total for e in events) / 1e6
        print(
            f"\nwidth {width}: {row['tokens_per_second']:,} tokens/s in training; whole run {wall:.2f} s wall, "
            f"device busy {busy:.2f} s",
            flush=True,
        )
        print(events.table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60), flush=True)
        print(events.table(sort_by="self_device_time_total", row_limit=12, max_name_column_width=60), flush=True)


if __name__ == "__main__":
    main([int(w) for w in sys.argv[1:]] or [128, 1024])
