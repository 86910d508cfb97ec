"""The Triton chunkwise kernels (forward and backward) against the fp64 reference.

Compiled on CUDA; on a CPU-only machine they run under ``TRITON_INTERPRET=1`` (set before triton is imported),
at sizes that cross a chunk boundary (chunks are 64 steps, sub-blocks 16).
"""

import importlib.util
import os

import pytest
import torch
import torch.nn.functional as F

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"  # read when triton is imported: set it first
if importlib.util.find_spec("triton") is None:
    pytest.skip("triton is not installed", allow_module_level=True)

from linrnn import ops  # noqa: E402
from linrnn.kernels.triton import chunk  # noqa: E402
from tests.helpers import (  # noqa: E402
    CELLS,
    OPS,
    assert_close,
    assert_runs_match,
    forward_backward,
    make_inputs,
    nan_filled,
    recorded_copies,
)


@pytest.fixture(autouse=True)
def poisoned_outputs(monkeypatch):
    """Every output and gradient buffer starts as NaN, so an element the kernels do not write fails."""
    monkeypatch.setattr(chunk, "new_output", nan_filled)


def to_kernel(inputs, dtype):
    """q, k, v, a in ``dtype``, gates and states in fp32, on the test device."""
    return {n: x.to(DEVICE, dtype if n in ("q", "k", "v", "a") else torch.float32) for n, x in inputs.items()}


def compare(cell, inputs, rtol, dtype=torch.float32, **op_args):
    on_host = {name: x.cpu() if isinstance(x, torch.Tensor) else x for name, x in op_args.items()}
    expected = forward_backward(cell, inputs, backend="reference", **on_host)  # the reference runs on the CPU
    actual = forward_backward(cell, to_kernel(inputs, dtype), backend="triton", **op_args)
    assert actual[0].dtype == dtype and actual[1].dtype == torch.float32
    assert_runs_match(actual, expected, rtol)


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("T, K, V, with_state", [(65, 20, 12, False), (1, 16, 8, True)], ids=["T65", "T1"])
def test_matches_reference(cell, T, K, V, with_state):
    inputs = make_inputs(cell, B=2, T=T, H=2, K=K, V=V, initial_state=with_state, seed=T + K)
    compare(cell, inputs, 1e-5)


@pytest.mark.parametrize("cell", ["deltanet", "gated_deltanet"])
def test_tied_erase_general_backward(cell, monkeypatch):
    """DeltaNet and GDN take the fused backward kernel up to ``FUSED_MAX_K``, the general kernels (KDA's) past it;
    K = 72 spans two 64-wide key blocks there."""
    monkeypatch.setattr(chunk, "FUSED_MAX_K", 0)
    inputs = make_inputs(cell, B=1, T=65, H=2, K=72, V=12, initial_state=True, seed=7)
    compare(cell, inputs, 1e-5)


@pytest.mark.parametrize("cell", ["gla", "kda", "gammanet", "gdn2"])
def test_two_key_blocks(cell):
    """K = 72: two 64-wide key blocks in the backward's per-block kernels (a bug there passed every K ≤ 64 test)."""
    inputs = make_inputs(cell, B=1, T=65, H=1, K=72, V=12, initial_state=True, seed=8)
    compare(cell, inputs, 1e-5)


@pytest.mark.parametrize("cell", ["gated_deltanet", "kda"])
def test_value_blocks_of_the_output_kernel(cell, monkeypatch):
    """V = 40 in blocks of 16 value columns (``OUTPUT_BLOCK_V``): the output kernel's later blocks (the first one
    stores A_qk with per-head decay), the last one partly masked."""
    monkeypatch.setattr(chunk, "OUTPUT_BLOCK_V", 16)
    inputs = make_inputs(cell, B=1, T=70, H=2, K=12, V=40, initial_state=True, seed=12)
    compare(cell, inputs, 1e-5)


@pytest.mark.parametrize("cell", ["gated_deltanet", "kda", "gammanet", "gdn2"])
def test_varlen(cell):
    lengths = [3, 64, 1, 17]
    inputs = make_inputs(cell, B=1, T=sum(lengths), H=2, K=12, V=10, initial_state=True, num_states=4, seed=3)
    cu_seqlens = torch.tensor([0, 3, 67, 68, 85], device=DEVICE)
    compare(cell, inputs, 1e-5, cu_seqlens=cu_seqlens)


@pytest.mark.parametrize("cell", ["gated_deltanet", "gla", "gammanet"])
def test_values_read_in_place_from_wider_rows(cell):
    """v as the model passes it, a column block of the short conv's output (tokens 3·H·V + 5 elements apart): the
    kernels read it where it is, with no copy, and give the same output and gradients, bit for bit, as from a
    contiguous v (GDN: the fused backward; GLA: no erase, v in the state pass and the output kernel; GammaNet:
    a decoupled write key)."""
    B, T, H, K, V = 2, 70, 2, 16, 12
    inputs = to_kernel(make_inputs(cell, B=B, T=T, H=H, K=K, V=V, initial_state=True, seed=11), torch.float32)
    wide = torch.randn(B, T, 3 * H * V + 5, device=DEVICE, dtype=torch.float64).float()
    wide[..., H * V : 2 * H * V] = inputs["v"].reshape(B, T, H * V)

    def run(v_from_rows):
        leaves = {name: x.clone().requires_grad_(True) for name, x in inputs.items() if name != "v"}
        rows = wide.clone().requires_grad_(True)
        block = rows[..., H * V : 2 * H * V]
        v = (block if v_from_rows else block.clone()).view(B, T, H, V)
        with recorded_copies() as copied:
            o, final = OPS[cell](**leaves, v=v, output_final_state=True, backend="triton")
            gen = torch.Generator().manual_seed(5)
            (o * torch.randn(o.shape, generator=gen).to(DEVICE)).sum().add(final.sum()).backward()
        return o, final, {name: x.grad for name, x in leaves.items()} | {"rows": rows.grad}, copied

    *strided, copied = run(True)
    *contiguous, _ = run(False)
    assert (B, T, H, V) not in copied
    assert torch.equal(strided[0], contiguous[0]) and torch.equal(strided[1], contiguous[1])
    for name, grad in contiguous[2].items():
        assert torch.equal(strided[2][name], grad), name


def test_varlen_index_built_once_per_boundaries(monkeypatch):
    """A model passes one step's packed documents to every layer's forward and backward: the chunk index is built
    (on the host, then copied) once per distinct ``cu_seqlens``, not once per op call, and the results stay
    correct when it comes from the cache."""
    built = []
    build = chunk._chunk_index
    monkeypatch.setattr(chunk, "_chunk_index", lambda lengths, device: built.append(lengths) or build(lengths, device))
    chunk._varlen_index.cache_clear()
    lengths = [7, 64, 30]
    inputs = make_inputs("gated_deltanet", B=1, T=sum(lengths), H=2, K=12, V=10, initial_state=True, num_states=3,
                         seed=4)  # fmt: skip
    for bounds in ([0, 7, 71, 101], [0, 7, 71, 101], [0, 70, 71, 101]):
        compare("gated_deltanet", inputs, 1e-5, cu_seqlens=torch.tensor(bounds))
    assert [x.tolist() for x in built] == [[7, 64, 30], [70, 1, 30]]


@pytest.mark.parametrize(("cell", "varlen"), [("gla", False), ("gated_deltanet", True), ("gammanet", True)])
def test_kept_states_equal_recomputed(cell, varlen, monkeypatch):
    """The backward from the forward's kept chunk states (``library.KEEP_STATES``, what autograd uses), with and
    without its kept intra-chunk matrices (``library.KEEP_INTRA``), equals the ones that rerun the state pass (from
    the kept intra-chunk matrices, and off the fused path W_s and U_v; or everything): the same kernels on the same
    inputs, so bit for bit. No erase (no kept values), tied erase, decoupled erase; varlen
    states have more rows than chunks (the bound from shapes)."""
    from linrnn.kernels import library

    lengths = [5, 64] if varlen else [70]  # varlen: 2 chunks, 3 rows
    inputs = make_inputs(cell, B=1, T=sum(lengths), H=1, K=12, V=10, initial_state=True, num_states=len(lengths),
                         seed=5)  # fmt: skip
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], device=DEVICE) if varlen else None
    runs = []
    for keep_states, keep_intra in ((True, "always"), (True, "never"), (False, "always"), (False, "never")):
        monkeypatch.setattr(library, "KEEP_STATES", keep_states)
        monkeypatch.setattr(library, "KEEP_INTRA", keep_intra)
        runs.append(forward_backward(cell, to_kernel(inputs, torch.float32), backend="triton", cu_seqlens=cu_seqlens))
    *kept_runs, recomputed_run = runs
    for kept_run in kept_runs:
        for kept, recomputed in zip(kept_run, recomputed_run, strict=True):
            if isinstance(kept, dict):
                assert kept.keys() == recomputed.keys()
                for name in kept:
                    assert torch.equal(kept[name], recomputed[name]), name
            else:
                assert torch.equal(kept, recomputed)


@pytest.mark.parametrize("decay", [False, True], ids=["deltanet", "gated_deltanet"])
def test_fused_path_write_keys_from_kept_t(decay):
    """The fused path's forward forms T only (no W_s, no U_v: its state pass works from T); the backward's
    recomputation forms W_s from the kept T (the solve's ``LOAD_T``), equal bit for bit to W_s formed beside T, and
    the chunk states and U of the state pass from T equal those through W_s and U_v within fp32 rounding."""
    inputs = make_inputs("gated_deltanet" if decay else "deltanet", B=1, T=70, H=2, K=16, V=8, seed=3)
    x = to_kernel(inputs, torch.float32)
    G = x["g"] if decay else None
    args = (x["q"], x["k"], None, x["v"], G, x["beta"])
    options = dict(erase=True, scale=0.25, initial_state=None, output_final_state=False, cu_seqlens=None)
    _, _, forward = chunk.chunk_forward(*args, **options)
    assert forward["W_s"] is None and forward["U_v"] is None
    _, _, direct = chunk.chunk_forward(*args, **options, need_output=False)  # T and W_s in one solve
    _, _, from_kept = chunk.chunk_forward(*args, **options, need_output=False,
                                          kept=dict(intra=forward["intra"].clone()))  # fmt: skip
    assert torch.equal(from_kept["W_s"], direct["W_s"])
    assert torch.equal(forward["T"], direct["T"])
    # U through W_s and U_v, as every other cell's state pass forms it
    T, W_s = direct["T"].double(), direct["W_s"].double()
    beta, v, k = x["beta"][0].double(), x["v"][0].double(), x["k"][0].double()
    g = x["g"][0].double() if decay else torch.zeros_like(beta)
    state = torch.zeros(2, 16, 8, dtype=torch.float64)
    for c in range(0, 70, 64):
        rows = slice(c, min(c + 64, 70))
        n = rows.stop - rows.start
        G_c = g[rows].cumsum(0)  # [n, H]
        for h in range(2):
            t = T[rows, h, :n]
            u = t @ (beta[rows, h, None] * v[rows, h]) - W_s[rows, h] @ state[h]
            assert_close(forward["states"][c // 64, h], state[h], 1e-6, "chunk start state")
            assert_close(forward["U"][rows, h], u, 1e-5, "U")
            decay_to_end = torch.exp(G_c[-1, h] - G_c[:, h])
            state[h] = torch.exp(G_c[-1, h]) * state[h] + (k[rows, h] * decay_to_end[:, None]).T @ u


@pytest.mark.parametrize(("cell", "mode"), [("gated_deltanet", True), ("gammanet", True), ("gammanet", None)])
def test_state_bwd_local_first(cell, mode, monkeypatch):
    """``chunk.STATE_BWD_LOCAL_FIRST``: the backward state pass's chunk-local terms from a parallel kernel first
    (tied and decoupled erase, varlen) against the fp64 reference; forced, and by length (``None``: sequences
    averaging ``LOCAL_FIRST_MIN_CHUNKS`` chunks, here 1, take it)."""
    monkeypatch.setattr(chunk, "STATE_BWD_LOCAL_FIRST", mode)
    monkeypatch.setattr(chunk, "LOCAL_FIRST_MIN_CHUNKS", 1)
    grids = []
    kernel = chunk.chunk_bwd_local_du_kernel

    class Counting:  # the kernel, noting each launch's grid
        def __getitem__(self, grid):
            grids.append(grid)
            return kernel[grid]

    monkeypatch.setattr(chunk, "chunk_bwd_local_du_kernel", Counting())
    lengths = [5, 64]
    inputs = make_inputs(cell, B=1, T=sum(lengths), H=1, K=12, V=10, initial_state=True, num_states=2, seed=9)
    compare(cell, inputs, 1e-5, cu_seqlens=torch.tensor([0, 5, 69], device=DEVICE))
    assert grids, "the local-first kernel never ran"


@pytest.mark.parametrize("cell", ["deltanet", "kda", "gammanet"])
def test_extreme_gates(cell):
    """Log-decay −20 per step on some steps (per channel for KDA and GammaNet), beta exactly 0 and 1: finite and
    exact."""
    inputs = make_inputs(cell, B=1, T=70, H=2, K=16, V=8, initial_state=True, seed=11)
    beta = inputs["beta"]
    beta[:, ::5], beta[:, 1::5] = 0.0, 1.0
    if "g" in inputs:
        inputs["g"][:, ::3, :, :4] = -20.0
    compare(cell, inputs, 1e-5)


# bf16 only compiled: the interpreter's bf16 matmul returns garbage (triton 3.6); fp16 takes the same code path.
HALF = [torch.float16, pytest.param(torch.bfloat16, marks=pytest.mark.gpu)]


@pytest.mark.parametrize("dtype", HALF, ids=["fp16", "bf16"])
@pytest.mark.parametrize("cell", ["gla", "gated_deltanet", "gammanet"])
def test_half_precision(cell, dtype):
    inputs = make_inputs(cell, B=1, T=70, H=2, K=16, V=16, initial_state=True, seed=5)
    compare(cell, inputs, 1e-2, dtype=dtype)


def test_dispatch(monkeypatch):
    """Triton picks the chunkwise kernels with autograd or past 64 steps, the fused recurrent one otherwise."""
    calls = []
    kernel = chunk.chunk_forward
    monkeypatch.setattr(chunk, "chunk_forward", lambda *a, **k: calls.append(1) or kernel(*a, **k))
    short, long = (to_kernel(make_inputs("kda", B=1, T=T, H=1, K=8, V=8), torch.float32) for T in (64, 65))
    with torch.no_grad():
        ops.kda(**short, backend="triton")
        assert calls == []
        ops.kda(**long, backend="triton")
        assert calls == [1]
    o, _ = ops.kda(**{**short, "q": short["q"].requires_grad_()}, backend="triton")
    assert calls == [1, 1] and o.requires_grad


def test_decoupled_without_beta_matches_torch():
    """``recurrence`` with its own erase direction and no beta (beta = 1) through the same kernels."""
    inputs = to_kernel(make_inputs("gammanet", B=1, T=66, H=1, K=8, V=8, seed=2), torch.float32)
    args = dict(q=inputs["q"], k=inputs["k"], v=inputs["v"], g=inputs["g"], e=inputs["a"], output_final_state=True)
    expected = ops.recurrence(**{n: x.double() for n, x in args.items() if n != "output_final_state"},
                              output_final_state=True, backend="reference")  # fmt: skip
    actual = ops.recurrence(**args, backend="triton")
    assert_close(actual[0].cpu(), expected[0].cpu(), 1e-5, "output")
    assert_close(actual[1].cpu(), expected[1].cpu(), 1e-5, "final state")


def assert_triton_matches_fp64(inputs, run, reference_backend="reference"):
    """``run(leaves, backend) -> (o, final_state)`` on fp64 leaves with ``reference_backend`` and on fp32 leaves with
    the Triton kernels: outputs, final state and every gradient (loss ``<o, dO> + <S_T, dS>``) within 1e-5."""
    results = []
    for backend, dtype in ((reference_backend, torch.float64), ("triton", torch.float32)):
        leaves = {n: x.detach().to(DEVICE, dtype).requires_grad_() for n, x in inputs.items()}
        o, final = run(leaves, backend)
        gen = torch.Generator().manual_seed(0)
        loss = (o.double() * torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.device)).sum()
        loss += (final.double() * torch.randn(final.shape, generator=gen, dtype=torch.float64).to(o.device)).sum()
        loss.backward()
        results.append((o.detach().cpu(), final.detach().cpu(), {n: x.grad.cpu() for n, x in leaves.items()}))
    assert_runs_match(results[1], results[0], 1e-5)


@pytest.mark.parametrize("decay", ["none", "head"])
def test_decoupled_backward_without_channel_decay(decay):
    """A decoupled erase direction (``e`` ≠ k) with no or per-head decay, which no cell uses: outputs, final state
    and every gradient against the fp64 reference, with an initial state and two packed sequences."""
    inputs = make_inputs("gated_deltanet", B=1, T=77, H=2, K=12, V=10, initial_state=True, num_states=2, seed=6)
    gen = torch.Generator().manual_seed(7)
    args = {n: inputs[n] for n in ("q", "k", "v", "beta", "initial_state")}
    args["e"] = F.normalize(torch.randn(inputs["k"].shape, generator=gen, dtype=torch.float64), dim=-1)
    if decay == "head":
        args["g"] = inputs["g"]
    cu_seqlens = torch.tensor([0, 9, 77], device=DEVICE)
    assert_triton_matches_fp64(args, lambda x, backend: ops.recurrence(
        **x, output_final_state=True, cu_seqlens=cu_seqlens, backend=backend))  # fmt: skip


@pytest.mark.parametrize(("decay", "decoupled"), [("none", False), ("head", False), ("channel", True)])
def test_erase_gate_in_other_structures(decay, decoupled):
    """A per-channel erase gate (the read vector ``b ⊙ k``) where no cell has one: no or per-head decay (the
    per-chunk branches of the intra kernels) and a decoupled erase direction (the rows of A_kw); outputs, final
    state and every gradient, db included, against the fp64 reference, with an initial state and two sequences."""
    inputs = make_inputs("gdn2", B=1, T=77, H=2, K=12, V=10, initial_state=True, num_states=2, seed=9)
    args = {n: inputs[n] for n in ("q", "k", "v", "initial_state")}
    args["erase_gate"] = inputs["b"]
    if decay != "none":
        args["g"] = inputs["g"] if decay == "channel" else inputs["g"].mean(-1)
    if decoupled:
        gen = torch.Generator().manual_seed(10)
        args["e"] = F.normalize(torch.randn(inputs["k"].shape, generator=gen, dtype=torch.float64), dim=-1)
    cu_seqlens = torch.tensor([0, 30, 77], device=DEVICE)
    assert_triton_matches_fp64(args, lambda x, backend: ops.recurrence(
        **x, output_final_state=True, cu_seqlens=cu_seqlens, backend=backend))  # fmt: skip


def test_fold_with_per_head_decay():
    """GammaNet's fold (``log_gamma``) is fused into the backward's last kernel for per-channel decay, the cell's
    own; with per-head decay (only through ``library.chunk_recurrence``) it runs ``fused.fold_backward`` instead:
    every gradient, d log Γ included, against the torch path in fp64."""
    from linrnn.kernels import library

    inputs = make_inputs("gammanet", B=2, T=70, H=2, K=12, V=10, initial_state=True, seed=4)
    inputs["g"] = make_inputs("gated_deltanet", B=2, T=70, H=2, K=12, V=10, seed=4)["g"]
    names = ("q", "k", "v", "a", "g", "beta", "log_gamma", "initial_state")

    def run(x, backend):
        return library.chunk_recurrence(x["q"], x["k"], x["v"], x["a"], x["g"], x["beta"], scale=12**-0.5,
                                        initial_state=x["initial_state"], output_final_state=True, backend=backend,
                                        log_gamma=x["log_gamma"])  # fmt: skip

    assert_triton_matches_fp64({n: inputs[n] for n in names}, run, reference_backend="torch")


@pytest.mark.parametrize("decay", ["none", "head"])
def test_no_erase_without_channel_decay(decay):
    """No erase and no per-channel decay (linear attention, RetNet-like): no ``intra`` launch, A_qk from the output
    kernel; outputs, final state and every gradient against the fp64 reference, with an initial state."""
    inputs = make_inputs("gated_deltanet", B=2, T=130, H=2, K=20, V=12, initial_state=True, seed=5)
    args = {n: inputs[n] for n in ("q", "k", "v", "initial_state")}
    if decay == "head":
        args["g"] = inputs["g"]
    assert_triton_matches_fp64(args, lambda x, backend: ops.recurrence(
        **x, erase=False, output_final_state=True, backend=backend))  # fmt: skip
