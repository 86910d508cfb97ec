"""Kernels per decoding step, counted on the CPU: the Triton launches (under ``TRITON_INTERPRET=1``, wrapped at the
interpreter's launch) and the compute aten ops of one ``Engine`` step of a one-layer model, so the per-layer count
of a CUDA graph replay can be read off without a GPU (views and the interpreter's own ``set_``/``copy_`` traffic
left out).

    python experiments/count_decode_launches.py gated_deltanet kda
"""

from __future__ import annotations

import os

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported

import collections  # noqa: E402
import sys  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402
from triton.runtime import interpreter  # noqa: E402

import linrnn  # noqa: E402

NOT_KERNELS = {"aten::set_", "aten::copy_", "aten::view", "aten::reshape", "aten::transpose", "aten::slice",
               "aten::split_with_sizes", "aten::select", "aten::expand", "aten::as_strided", "aten::unsqueeze",
               "aten::split", "aten::t", "aten::detach", "aten::alias", "aten::contiguous", "aten::empty",
               "aten::empty_strided", "aten::permute", "aten::_unsafe_view", "aten::expand_as",
               "aten::promote_types", "aten::result_type", "aten::item", "aten::_local_scalar_dense",
               "aten::squeeze", "aten::flatten", "aten::to", "aten::_to_copy", "aten::full",
               "aten::new_empty", "aten::chunk"}  # fmt: skip


def main(cells: list[str]) -> None:
    launches = collections.Counter()
    launch = interpreter.InterpretedFunction.run

    def counted(self, *args, **kwargs):
        launches[self.fn.__name__] += 1
        return launch(self, *args, **kwargs)

    interpreter.InterpretedFunction.run = counted
    for cell in cells:
        model = linrnn.build_model(cell, num_layers=1, hidden_size=256, num_heads=2, vocab_size=512, backend="triton")
        engine = linrnn.Engine(model.eval(), slots=2, cuda_graph=False)
        with torch.no_grad():
            engine._step(greedy=True)  # first call: the projections' weight is concatenated and kept
            launches.clear()
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                engine._step(greedy=True)
        events = [e for e in prof.events() if e.name.startswith("aten::")]
        top = [e for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
        ops = collections.Counter(e.name for e in top if e.name not in NOT_KERNELS)
        print(f"{cell}: {sum(launches.values())} Triton launches {dict(launches)}")
        print(f"  {sum(ops.values())} aten compute ops {dict(ops)}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["gated_deltanet"])
