"""CPU: the torch chunkwise backend against the sequential reference, GDN forward+backward.

Run: ``python -m pytest benchmarks/test_cpu_backends.py --benchmark-only --benchmark-columns=median,min,max``
(not part of the test suite; timings go to benchmarks/RESULTS.md).
"""

import pytest
import torch

from linrnn import ops
from tests.helpers import make_inputs

SHAPE = dict(B=2, T=2048, H=4, K=64, V=64)


def fwd_bwd(inputs, backend):
    leaves = {name: x.detach().clone().requires_grad_(True) for name, x in inputs.items()}
    o, final = ops.gated_delta_rule(**leaves, output_final_state=True, backend=backend)
    (o.sum() + final.sum()).backward()


@pytest.mark.parametrize("backend", ["torch", "reference"])
def test_gdn_fwd_bwd_cpu(benchmark, backend):
    inputs = make_inputs("gated_deltanet", dtype=torch.float32, seed=0, **SHAPE)
    inputs = {name: x.float() for name, x in inputs.items()}
    benchmark.extra_info.update(SHAPE, dtype="float32", threads=torch.get_num_threads(), torch=torch.__version__)
    benchmark.pedantic(fwd_bwd, args=(inputs, backend), rounds=10 if backend == "torch" else 5, warmup_rounds=1)
