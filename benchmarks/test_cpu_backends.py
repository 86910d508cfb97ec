"""CPU: the torch chunkwise backend against the sequential reference, forward+backward, per cell.

Run: ``python -m pytest benchmarks/test_cpu_backends.py --benchmark-only --benchmark-columns=median,min,max,rounds``
(not part of the test suite; timings go to benchmarks/RESULTS.md).
"""

import pytest
import torch

from tests.helpers import CELLS, OPS, make_inputs

SHAPE = dict(B=2, T=2048, H=4, K=64, V=64)


def fwd_bwd(cell, inputs, backend):
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    o, final = OPS[cell](**leaves, output_final_state=True, backend=backend)
    (o.sum() + final.sum()).backward()


@pytest.mark.parametrize("backend", ["torch", "reference"])
@pytest.mark.parametrize("cell", CELLS)
def test_fwd_bwd_cpu(benchmark, cell, backend):
    inputs = {name: x.float() for name, x in make_inputs(cell, seed=0, **SHAPE).items()}
    benchmark.group = cell
    benchmark.extra_info.update(SHAPE, dtype="float32", threads=torch.get_num_threads(), torch=torch.__version__)
    benchmark.pedantic(fwd_bwd, args=(cell, inputs, backend), rounds=10 if backend == "torch" else 5, warmup_rounds=1)
