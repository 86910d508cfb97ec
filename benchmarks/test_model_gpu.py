"""Whole-model training step: linrnn's LM (eager and compiled) against FLA 0.6.0's models and a transformers Llama.

Run on the GPU machine (FLA and transformers carried as wheels; ``bash experiments/gpu_model.sh`` does all of this)::

    python -m pytest benchmarks/test_model_gpu.py --benchmark-only --benchmark-json=model.json
    python benchmarks/report.py model.json

One step: forward under bf16 autocast with fp32 parameters, the mean next-token cross-entropy, backward, gradient
clipping at 1.0, fused AdamW — the same loop for every model, at ~340M parameters: vocab 32000, hidden 1024,
SwiGLU 2816, tied embeddings; linrnn and FLA with 21 layers of 6 heads (K = 128, V = 256), the Llama with 24
layers of 16 heads (SDPA). linrnn's loss is ``LanguageModel.loss`` (no ``[B, T, vocab]`` logits); "compiled" is
``torch.compile(model.loss, fullgraph=True)``, "graphed" the same with ``mode="reduce-overhead"`` (CUDA graphs). FLA
and the Llama compute their loss from the logits as their ``labels=`` path does. Shapes B×T ∈ {4×4096, 1×16384}
(``MODEL_BENCH_SHAPES``); models in ``MODEL_BENCH_MODELS``; tests that would start after ``MODEL_BENCH_DEADLINE``
(epoch seconds) skip. ``MODEL_BENCH_PAIRS="linrnn_gdn_compiled:fla_gdn,..."`` also times each pair in one process with
their steps alternating (``test_paired_steps``: A's speed-up as the median of the per-round ratios, steadier than
two medians taken minutes apart on a host whose load varies). ``MODEL_BENCH_LOCAL_FIRST=1`` (or ``0``) sets
``chunk.STATE_BWD_LOCAL_FIRST`` (the backward state pass's chunk-local terms from a parallel kernel first; by
default chosen by sequence length) for this process; ``MODEL_BENCH_KEEP_INTRA`` sets ``library.KEEP_INTRA``.
Reported per test (``extra_info``): tokens/s at the median step and at the fastest one, the steps' spread
((slowest − fastest) / median: a step bound by the host varies with the host's load), peak allocated and peak
reserved GiB over the timed steps (a CUDA graph's memory shows only in the reserved one), parameter count, the
first and last loss. ``MODEL_BENCH_PROFILE_DIR=DIR`` also writes a profiler table and a Chrome trace (shapes
recorded; ``experiments/trace_summary.py`` reads it) of two more steps per test there. FLA 0.6.0 refuses its gated
backward on Hopper with triton < 3.7.1 (its issue #640); the guard is lifted here for speed only
(``fla_bwd_guard_lifted``).

CPU dry run of the harness (tiny models, linrnn only)::

    MODEL_BENCH_DEVICE=cpu MODEL_BENCH_SHAPES=2x64 MODEL_BENCH_MODELS=linrnn_gdn,linrnn_gdn_compiled \\
    python -m pytest benchmarks/test_model_gpu.py --benchmark-only
"""

from __future__ import annotations

import os
import statistics
import time

import pytest
import torch
import torch.nn.functional as F

DEVICE = os.environ.get("MODEL_BENCH_DEVICE", "cuda")
SHAPES = [tuple(map(int, s.split("x"))) for s in os.environ.get("MODEL_BENCH_SHAPES", "4x4096,1x16384").split(",")]
MODELS = os.environ.get(
    "MODEL_BENCH_MODELS",
    "linrnn_gdn,linrnn_gdn_compiled,linrnn_gdn_graphed,fla_gdn,llama,linrnn_kda,linrnn_kda_compiled,fla_kda,"
    "linrnn_gammanet,linrnn_gammanet_compiled",
).split(",")
ROUNDS = int(os.environ.get("MODEL_BENCH_ROUNDS", "8"))
# "A:B,...": pairs timed in alternation (test_paired_steps); none by default
PAIRS = [tuple(p.split(":")) for p in os.environ.get("MODEL_BENCH_PAIRS", "").split(",") if p]
DEADLINE = float(os.environ.get("MODEL_BENCH_DEADLINE", "inf"))  # epoch seconds: later tests skip
VOCAB, HIDDEN, LAYERS, HEADS, MLP = (32000, 1024, 21, 6, 2816) if DEVICE == "cuda" else (512, 64, 2, 2, 128)
if os.environ.get("MODEL_BENCH_LOCAL_FIRST") in ("0", "1"):
    from linrnn.kernels.triton import chunk

    chunk.STATE_BWD_LOCAL_FIRST = os.environ["MODEL_BENCH_LOCAL_FIRST"] == "1"
if os.environ.get("MODEL_BENCH_KEEP_INTRA"):  # "never", "decoupled" or "always" (linrnn.kernels.library)
    from linrnn.kernels import library

    library.KEEP_INTRA = os.environ["MODEL_BENCH_KEEP_INTRA"]

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("needs CUDA (or MODEL_BENCH_DEVICE=cpu for a dry run)", allow_module_level=True)


def linrnn_model(name: str):
    """linrnn's model of a cell or a named hybrid as the training configs name them (``gdn``, ``gdn-hybrid``)."""
    import linrnn
    from linrnn.training.names import cells, resolve_cell

    cell, pattern = resolve_cell(cells()[name])
    if DEVICE == "cuda":
        return linrnn.build_model(cell, preset="340m", layer_pattern=pattern)
    return linrnn.build_model(cell, vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS,
                              intermediate_size=MLP, layer_pattern=pattern)  # fmt: skip


def fla_model(cell: str):
    import fla.ops.common.chunk_o as chunk_o

    chunk_o.TRITON_ABOVE_3_7_1 = True  # the Hopper guard (module docstring): speed only
    shared = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_heads=HEADS, head_dim=128, expand_v=2.0,
                  intermediate_size=MLP, vocab_size=VOCAB, tie_word_embeddings=True)  # fmt: skip
    if cell == "gdn":
        from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM

        return GatedDeltaNetForCausalLM(GatedDeltaNetConfig(**shared))
    from fla.models import KDAConfig, KDAForCausalLM

    return KDAForCausalLM(KDAConfig(**shared))


def llama_model(steps: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=24, num_attention_heads=16, num_key_value_heads=16,
                         intermediate_size=MLP, vocab_size=VOCAB, tie_word_embeddings=True,
                         max_position_embeddings=steps)  # fmt: skip
    config._attn_implementation = "sdpa"
    return LlamaForCausalLM(config)


def build(name: str, steps: int):
    """(model, loss(input_ids, targets), extra_info)."""
    family, *rest = name.split("_")  # linrnn_<cell>[_compiled] (a config name's cell: gdn, gdn-hybrid), fla_<cell>
    cell, mode = (rest[0], rest[1:]) if rest else (None, [])
    if family == "linrnn":
        model = linrnn_model(cell)
        if mode == ["compiled"]:
            torch._dynamo.reset()  # a fresh cache per test: another shape would otherwise recompile as dynamic
            return model, torch.compile(model.loss, fullgraph=True, dynamic=False), {}
        if mode == ["graphed"]:  # the compiled step replayed as CUDA graphs: no per-kernel host work
            torch._dynamo.reset()
            compiled = torch.compile(model.loss, fullgraph=True, dynamic=False, mode="reduce-overhead")

            def graphed_loss(ids, targets):
                torch.compiler.cudagraph_mark_step_begin()
                return compiled(ids, targets)

            return model, graphed_loss, {}
        loss = model.loss
        return model, loss, {}
    if family == "fla":
        pytest.importorskip("fla")
        model = fla_model(cell)
    elif family == "llama":
        pytest.importorskip("transformers")
        model = llama_model(steps)
    else:
        raise ValueError(f"MODEL_BENCH_MODELS: unknown model {name!r}")

    def logits_loss(ids, targets):
        logits = model(input_ids=ids).logits
        return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())

    return model, logits_loss, {"fla_bwd_guard_lifted": family == "fla"}


def make_step(name: str, shape: tuple[int, int]):
    """(model, step, losses, info): one training step of model ``name`` at ``shape`` with its own optimizer and
    batch, warmed up (compiled, autotuned, allocator settled); ``losses`` collects every step's loss."""
    batch, steps = shape
    torch.manual_seed(0)
    model, loss_fn, info = build(name, steps)
    model = model.to(DEVICE).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, fused=DEVICE == "cuda")
    gen = torch.Generator(device=DEVICE).manual_seed(1)
    ids = torch.randint(0, VOCAB, (batch, steps + 1), device=DEVICE, generator=gen)
    inputs, targets = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    losses = []

    def step():
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            loss = loss_fn(inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.detach().clone())  # a CUDA-graph output is overwritten by the next replay
        if DEVICE == "cuda":
            torch.cuda.synchronize()

    for _ in range(3):  # compile, autotune, allocator warm-up
        step()
    return model, step, losses, info


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{t}" for b, t in SHAPES])
@pytest.mark.parametrize("name", MODELS)
def test_training_step(benchmark, name, shape):
    batch, steps = shape
    if time.time() > DEADLINE:
        pytest.skip("MODEL_BENCH_DEADLINE passed (a benchmark cut short writes no results at all)")
    model, step, losses, info = make_step(name, shape)
    if DEVICE == "cuda":
        torch.cuda.reset_peak_memory_stats()
    benchmark.pedantic(step, rounds=ROUNDS, iterations=1)
    stats = benchmark.stats.stats
    median = stats.median
    peak = torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None
    # a CUDA graph's pool is allocated while capturing (warm-up) and only reserved while replaying: the reserved
    # peak is the graphed step's memory
    reserved = torch.cuda.max_memory_reserved() / 2**30 if DEVICE == "cuda" else None
    benchmark.extra_info.update(
        kind="model", model=name, batch=batch, steps=steps, tokens_per_s=batch * steps / median,
        best_tokens_per_s=batch * steps / stats.min, spread=(stats.max - stats.min) / median,
        peak_gib=peak, reserved_gib=reserved, params=sum(p.numel() for p in model.parameters()),
        first_loss=float(losses[0]), last_loss=float(losses[-1]), **info,
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
    )  # fmt: skip
    assert torch.isfinite(torch.stack(losses)).all()
    profile_dir = os.environ.get("MODEL_BENCH_PROFILE_DIR")
    if profile_dir:  # where the time goes: two more steps under the profiler, the top kernels as a table
        from torch.profiler import ProfilerActivity, profile

        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if DEVICE == "cuda" else [])
        with profile(activities=activities, record_shapes=True) as prof:
            step()
            step()
        prof.export_chrome_trace(os.path.join(profile_dir, f"trace_{name}_{batch}x{steps}.json"))
        sort = "cuda_time_total" if DEVICE == "cuda" else "cpu_time_total"
        table = prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=80)
        with open(os.path.join(profile_dir, f"profile_{name}_{batch}x{steps}.txt"), "w") as file:
            file.write(table)


@pytest.mark.parametrize("shape", SHAPES, ids=[f"{b}x{t}" for b, t in SHAPES])
@pytest.mark.parametrize("pair", PAIRS, ids=[f"{a}-vs-{b}" for a, b in PAIRS])
def test_paired_steps(benchmark, pair, shape):
    """Two models in one process, their steps alternating A B B A …: a load on the host that comes and goes hits
    both alike, so the ratio of each round's step times is steadier than the ratio of two separate medians.
    Reported: each model's median tokens/s and the median over rounds of time(B) / time(A), A's speed-up."""
    if time.time() > DEADLINE:
        pytest.skip("MODEL_BENCH_DEADLINE passed (a benchmark cut short writes no results at all)")
    batch, steps = shape
    steps_of = {name: make_step(name, shape)[1] for name in pair}
    for step in steps_of.values():  # a compiled model built second resets dynamo: the first recompiles here
        step()
    times = {name: [] for name in pair}

    def timed(name):
        start = time.perf_counter()
        steps_of[name]()
        times[name].append(time.perf_counter() - start)

    def round_():  # A B, then B A: the order alternates with the rounds
        order = pair if len(times[pair[0]]) % 2 == 0 else pair[::-1]
        for name in order:
            timed(name)

    benchmark.pedantic(round_, rounds=2 * ROUNDS, iterations=1)
    first, second = pair
    ratios = [b / a for a, b in zip(times[first], times[second], strict=True)]
    benchmark.extra_info.update(
        kind="pair", a=first, b=second, batch=batch, steps=steps, rounds=len(ratios),
        a_tokens_per_s=batch * steps / statistics.median(times[first]),
        b_tokens_per_s=batch * steps / statistics.median(times[second]),
        speedup=statistics.median(ratios), speedup_low=min(ratios), speedup_high=max(ratios),
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
    )  # fmt: skip
