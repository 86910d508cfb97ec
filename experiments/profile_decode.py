"""Where a decoding step's time goes, on the GPU: the 340M model (bf16, random weights) in an ``Engine`` with
``--slots`` slots after a short prompt each; the graph-replayed step timed with CUDA events (median of ``--steps``),
then the same step run without the graph under torch.profiler, kernel by kernel (mean µs per step, launches per
step, share of the summed kernel time). Replay time minus summed kernel time is what launches cost inside the graph.

    python experiments/profile_decode.py --cell gdn --slots 1 [--state-dtype bf16]
"""

from __future__ import annotations

import argparse
import collections
import statistics

import torch
from torch.profiler import ProfilerActivity, profile

import linrnn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", default="gdn")
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--state-dtype", choices=("fp32", "bf16"), default="fp32")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    model = linrnn.build_model(args.cell, preset="340m").to("cuda", torch.bfloat16).eval()
    state_dtype = torch.bfloat16 if args.state_dtype == "bf16" else None
    engine = linrnn.Engine(model, slots=args.slots, state_dtype=state_dtype)
    prompts = [torch.randint(0, model.config.vocab_size, (64,)) for _ in range(args.slots)]
    for _ in engine.stream(prompts, linrnn.Sampling(max_new_tokens=4, temperature=0)):
        pass  # prefill, graph capture and a few steps
    times = []
    for _ in range(args.steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        engine._decode_step(greedy=True)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000)
    replay = statistics.median(times)
    profiled = 20
    with torch.no_grad():
        for _ in range(3):
            engine._step(greedy=True)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(profiled):
                engine._step(greedy=True)
            torch.cuda.synchronize()
    total, count = collections.Counter(), collections.Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            total[event.name] += event.device_time
            count[event.name] += 1
    kernels = sum(total.values()) / profiled
    launches = sum(count.values()) / profiled
    print(f"{args.cell} slots={args.slots} state={args.state_dtype}: graph replay {replay:.1f} µs a step (median of "
          f"{args.steps}); kernels {kernels:.1f} µs summed, {launches:.0f} launches a step; replay − kernels "
          f"{replay - kernels:.1f} µs ({(replay - kernels) / launches:.2f} µs a launch)")  # fmt: skip
    print(f"{'µs/step':>8} {'n/step':>6} {'share':>6}  kernel")
    for name, time in total.most_common(args.top):
        print(f"{time / profiled:8.1f} {count[name] / profiled:6.1f} {time / profiled / kernels:6.1%}  {name[:110]}")


if __name__ == "__main__":
    main()
