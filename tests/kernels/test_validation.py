"""Bad input raises a ValueError naming the argument, the expected and the actual value."""

import pytest
import torch

import linrnn
from linrnn import ops
from tests.helpers import OPS, make_inputs


def call(cell="kda", backend="torch", **changes):
    x = make_inputs(cell, B=2, T=10, H=3, K=8, V=6, seed=0)
    x.update(changes)
    return OPS[cell](**x, backend=backend)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(q=torch.randn(2, 10, 3)), r"'q' must have shape \[B, T, H, K\] = \[B, T, H, K\], got shape \[2, 10, 3\]"),
        (
            dict(k=torch.randn(2, 10, 3, 7, dtype=torch.float64)),
            r"'k' must have shape .*\[2, 10, 3, 8\], got shape \[2, 10, 3, 7\]",
        ),
        (
            dict(v=torch.randn(2, 10, 4, 6, dtype=torch.float64)),
            r"'v' must have shape .*\[2, 10, 3, V\], got shape \[2, 10, 4, 6\]",
        ),
        (
            dict(g=torch.zeros(2, 10, 3, dtype=torch.float64)),
            r"'g' must have shape \[B, T, H, K\] \(per-channel.*got shape \[2, 10, 3\]",
        ),
        (
            dict(beta=torch.rand(2, 10, 3, 1, dtype=torch.float64)),
            r"'beta' must have shape \[B, T, H\].*got shape \[2, 10, 3, 1\]",
        ),
        (
            dict(v=torch.randn(2, 10, 3, 6, dtype=torch.float32)),
            r"'v' must have dtype torch.float64 \(as 'q'\), got torch.float32",
        ),
        (
            dict(v=torch.randn(2, 10, 3, 6, dtype=torch.float64, device="meta")),
            r"'v' must have device cpu \(as 'q'\), got meta",
        ),
        (dict(q=torch.randint(0, 3, (2, 10, 3, 8))), r"'q' must be a floating-point tensor, got dtype torch.int64"),
        (dict(beta=None), r"'beta' \(write \(and erase\) strength\) is required, got None"),
        (
            dict(initial_state=torch.zeros(3, 3, 8, 6)),
            r"'initial_state' must have shape .*\[2, 3, 8, 6\], got shape \[3, 3, 8, 6\]",
        ),
        (dict(q=torch.randn(2, 0, 3, 8, dtype=torch.float64)), r"at least one time step"),
    ],
)
def test_structural_errors(changes, pattern):
    with pytest.raises(ValueError, match=pattern):
        call(**changes)


def test_gdn_rejects_per_channel_gate():
    with pytest.raises(ValueError, match=r"cell 'gated_deltanet': argument 'g' must have shape \[B, T, H\]"):
        call("gated_deltanet", g=torch.zeros(2, 10, 3, 8, dtype=torch.float64))
    inputs = make_inputs("gated_deltanet", B=2, T=10, H=3, K=8, V=6)
    with pytest.raises(ValueError, match=r"linrnn.ops.gated_delta_rule: argument 'g' must have shape \[B, T, H\]"):
        ops.gated_delta_rule(**{**inputs, "g": torch.zeros(2, 10, 3, 8, dtype=torch.float64)})


def test_unexpected_inputs_and_options_are_named():
    inputs = make_inputs("kda", B=1, T=4, H=1, K=4, V=4)
    with pytest.raises(ValueError, match=r"cell 'kda': got unexpected input 'a'; this op takes q, k, v, g, beta"):
        linrnn.get_cell("kda").op(**inputs, a=inputs["k"])
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'chunksize'"):
        ops.kda(**inputs, chunksize=16)
    with pytest.raises(ValueError, match=r"'chunk_size' must be None or 64 here \(backend 'reference' is sequential"):
        ops.kda(**inputs, backend="reference", chunk_size=16)


def test_gdn2_gate_values_are_checked():
    inputs = make_inputs("gdn2", B=1, T=4, H=1, K=4, V=4)
    with pytest.raises(ValueError, match=r"argument 'b' must lie in \[0, 2\], got range"):
        ops.gdn2(**{**inputs, "b": inputs["b"] + 3}, backend="reference")
    with pytest.raises(ValueError, match=r"argument 'w' must have shape \[B, T, H, V\] = \[1, 4, 1, 4\]"):
        ops.gdn2(**{**inputs, "w": inputs["w"][..., :2]})


def test_gammanet_arguments():
    with pytest.raises(ValueError, match=r"'log_gamma' must have shape \[H, K\] = \[3, 8\], got shape \[8\]"):
        call("gammanet", log_gamma=torch.zeros(8, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"'a' must have shape .*got shape \[2, 10, 3, 5\]"):
        call("gammanet", a=torch.randn(2, 10, 3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"'a' must have unit-norm rows"):
        call("gammanet", backend="reference", a=3 * torch.ones(2, 10, 3, 8, dtype=torch.float64))


def test_cu_seqlens_errors():
    x = make_inputs("gated_deltanet", B=1, T=10, H=2, K=4, V=4, seed=0)
    with pytest.raises(ValueError, match=r"'cu_seqlens' must start at 0 and end at T = 10.*got \[0, 4, 9\]"):
        ops.gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 4, 9]))
    with pytest.raises(ValueError, match=r"'cu_seqlens' must be non-decreasing, got \[0, 6, 4, 10\]"):
        ops.gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 6, 4, 10]))
    with pytest.raises(ValueError, match=r"'cu_seqlens' must be a 1-D integer tensor"):
        ops.gated_delta_rule(**x, cu_seqlens=torch.tensor([0.0, 10.0]))
    with pytest.raises(ValueError, match=r"'initial_state' must have shape .*\[3, 2, 4, 4\], got shape \[1, 2, 4, 4\]"):
        ops.gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 2, 5, 10]), initial_state=torch.zeros(1, 2, 4, 4))
    y = make_inputs("gated_deltanet", B=2, T=10, H=2, K=4, V=4, seed=0)
    with pytest.raises(ValueError, match=r"'cu_seqlens' requires batch size B = 1.*got B = 2"):
        ops.gated_delta_rule(**y, cu_seqlens=torch.tensor([0, 10]))
    with pytest.raises(ValueError, match=r"'cu_seqlens' must be on the CPU or on q's device cpu, got meta"):
        ops.gated_delta_rule(**x, cu_seqlens=torch.tensor([0, 10], device="meta"))


def test_backend_and_option_errors(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(
        ValueError, match=r"'backend' must be one of \['auto', 'triton', 'torch', 'reference'\], got 'cuda'"
    ):
        call(backend="cuda")
    with pytest.raises(
        ValueError, match=r"backend 'triton' needs CUDA tensors \(or TRITON_INTERPRET=1 on CPU\), got device cpu"
    ):
        call(backend="triton")
    with pytest.raises(ValueError, match=r"'chunk_size' must be a positive int, got 0"):
        ops.kda(**make_inputs("kda", B=1, T=4, H=1, K=4, V=4), chunk_size=0)
    with pytest.raises(ValueError, match=r"'e' must be None when erase=False"):
        x = make_inputs("kda", B=1, T=4, H=1, K=4, V=4)
        ops.recurrence(x["q"], x["k"], x["v"], e=x["k"], erase=False)


@pytest.mark.parametrize(
    "changes, pattern",
    [
        (dict(g=torch.full((2, 10, 3, 8), 0.1, dtype=torch.float64)), r"'g' \(log-decay\) must be <= 0, got max 0.1"),
        (dict(g=torch.full((2, 10, 3, 8), float("nan"), dtype=torch.float64)), r"'g' \(log-decay\) must be finite"),
        (
            dict(beta=torch.full((2, 10, 3), 2.5, dtype=torch.float64)),
            r"'beta' must lie in \[0, 2\], got range \[2.5, 2.5\]",
        ),
        (dict(beta=torch.full((2, 10, 3), float("inf"), dtype=torch.float64)), r"'beta' must be finite"),
    ],
)
def test_value_checks_on_request_and_in_reference(changes, pattern):
    call(**changes)  # default: no content checks (they would cost a device sync)
    with pytest.raises(ValueError, match=pattern):
        call(backend="reference", **changes)
    x = make_inputs("kda", B=2, T=10, H=3, K=8, V=6, seed=0)
    x.update(changes)
    with pytest.raises(ValueError, match=pattern):
        ops.kda(**x, check_values=True)
