"""Decoding at ~340M: linrnn's ``Engine`` (CUDA graphs) against transformers' Llama ``generate`` (KV cache) and FLA
0.6.0's ``generate``, greedy, bf16 weights, in one run.

Run on the GPU machine (``bash experiments/gpu_generate.sh``)::

    python -m pytest benchmarks/test_generate_gpu.py --benchmark-only --benchmark-json=generate.json
    python benchmarks/report.py generate.json

Settings (batch, prompt tokens, new tokens): (1, 512, 128) for the latency, (32, 4096, 128) and (256, 4096, 64) for
the throughput; ``GENERATE_BENCH_SETTINGS`` as ``BxPxN,...``. Models in ``GENERATE_BENCH_MODELS``; tests that would
start after ``GENERATE_BENCH_DEADLINE`` (epoch seconds) skip. Each test times the whole call (prefill + decode),
split where the first new token reaches the host: linrnn's ``Engine.stream`` yields it, transformers' ``generate``
hands it to a streamer. The decode rate is ``batch · (new − 1) / decode seconds`` (medians of ``GENERATE_BENCH_ROUNDS``
rounds, default 3, after a warm-up call) and the step time its inverse at batch 1. Reported (``extra_info``): ms per
decode step, decode tokens/s, prefill seconds, peak GiB, and the bytes of decode state per sequence (linrnn:
short-conv histories and fp32 recurrent states; the Llama: the bf16 KV cache at the prompt length and at 32k). A
setting whose KV cache cannot fit on the card is skipped for the Llama.

Models ``linrnn_<cell>_bf16state`` decode with ``Engine(state_dtype=torch.bfloat16)``; ``test_bf16_state_agreement``
compares their greedy tokens with the fp32 state's (``GENERATE_STATE_AGREEMENT``).

``test_generate_function``: ``linrnn.generate()`` (which keeps the ``Engine`` it builds, and on CUDA its captured
graph, with the model for the next call of the same batch size) against an ``Engine`` the caller keeps and the
former token-by-token loop (tests/models/reference_generate.py), Gated DeltaNet, greedy, at the settings of
``GENERATE_API_SETTINGS`` (default ``1x512x128,32x512x128``): each round times a call for 1 new token and one for
``new``; the prefill is the first, the decode the difference.

CPU dry run (tiny models, linrnn only)::

    GENERATE_BENCH_DEVICE=cpu GENERATE_BENCH_SETTINGS=2x16x4 GENERATE_API_SETTINGS=1x16x4,2x16x4 \\
    GENERATE_BENCH_MODELS=linrnn_gdn python -m pytest benchmarks/test_generate_gpu.py --benchmark-only
"""

from __future__ import annotations

import os
import statistics
import time

import pytest
import torch

DEVICE = os.environ.get("GENERATE_BENCH_DEVICE", "cuda")
_SETTINGS = os.environ.get("GENERATE_BENCH_SETTINGS", "1x512x128,32x4096x128,256x4096x64")
SETTINGS = [tuple(map(int, s.split("x"))) for s in _SETTINGS.split(",")]
_API_SETTINGS = os.environ.get("GENERATE_API_SETTINGS", "1x512x128,32x512x128")
API_SETTINGS = [tuple(map(int, s.split("x"))) for s in _API_SETTINGS.split(",")]
MODELS = os.environ.get("GENERATE_BENCH_MODELS", "linrnn_gdn,linrnn_kda,llama,fla_gdn,fla_kda").split(",")
ROUNDS = int(os.environ.get("GENERATE_BENCH_ROUNDS", "3"))
DEADLINE = float(os.environ.get("GENERATE_BENCH_DEADLINE", "inf"))  # epoch seconds: later tests skip
VOCAB, HIDDEN, LAYERS, HEADS, MLP = (32000, 1024, 21, 6, 2816) if DEVICE == "cuda" else (512, 64, 2, 2, 128)
LLAMA_LAYERS, LLAMA_HEADS = (24, 16) if DEVICE == "cuda" else (2, 4)
CELLS = {"gdn": "gated_deltanet", "kda": "kda"}

if DEVICE == "cuda" and not torch.cuda.is_available():
    pytest.skip("needs CUDA (or GENERATE_BENCH_DEVICE=cpu for a dry run)", allow_module_level=True)


def kv_cache_bytes(tokens: int) -> int:
    """The Llama's bf16 K and V for one sequence of ``tokens``."""
    return 2 * LLAMA_LAYERS * tokens * HIDDEN * 2


def build(name: str, batch: int, prompt: int):
    """(run(ids, new_tokens) -> generated ids or token lists, extra_info)."""
    family, *cell = name.split("_")
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    if family == "linrnn":
        import linrnn

        if DEVICE == "cuda":
            model = linrnn.build_model(CELLS[cell[0]], preset="340m")
        else:
            model = linrnn.build_model(CELLS[cell[0]], vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                                       num_heads=HEADS, intermediate_size=MLP)  # fmt: skip
        model = model.to(DEVICE, dtype).eval()
        state_dtype = torch.bfloat16 if "bf16state" in cell else None
        engine = linrnn.Engine(model, slots=batch, state_dtype=state_dtype)
        state_bytes = sum(t.numel() * t.element_size() for layer in engine.states
                          for t in [layer.recurrent, *layer.conv.values()]) // batch  # fmt: skip

        def run(ids, new):
            """(prefill seconds, decode seconds): with a slot per prompt, the first len(ids) tokens streamed are the
            prefills' (each read on the host, so the device is done); every later one comes from a decode step."""
            start, streamed = time.perf_counter(), 0
            for _ in engine.stream(list(ids), linrnn.Sampling(max_new_tokens=new, temperature=0)):
                streamed += 1
                if streamed == len(ids):
                    prefilled = time.perf_counter()
            synchronize()
            return prefilled - start, time.perf_counter() - prefilled

        return run, {"state_bytes_per_sequence": state_bytes}
    if family == "llama":
        pytest.importorskip("transformers")
        if DEVICE == "cuda":
            free = torch.cuda.mem_get_info()[0]
            if batch * kv_cache_bytes(prompt + 128) > 0.8 * free:
                pytest.skip(f"the Llama's KV cache, {batch * kv_cache_bytes(prompt) / 2**30:.0f} GiB, does not fit")
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(hidden_size=HIDDEN, num_hidden_layers=LLAMA_LAYERS, num_attention_heads=LLAMA_HEADS,
                             num_key_value_heads=LLAMA_HEADS, intermediate_size=MLP, vocab_size=VOCAB,
                             tie_word_embeddings=True, max_position_embeddings=prompt + 256)  # fmt: skip
        config._attn_implementation = "sdpa"
        model = LlamaForCausalLM(config)
        info = {"kv_cache_bytes_per_sequence": kv_cache_bytes(prompt), "kv_cache_bytes_at_32k": kv_cache_bytes(32768)}
    else:
        pytest.importorskip("fla")
        from fla.models import GatedDeltaNetConfig, GatedDeltaNetForCausalLM, KDAConfig, KDAForCausalLM

        shared = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_heads=HEADS, head_dim=128, expand_v=2.0,
                      intermediate_size=MLP, vocab_size=VOCAB, tie_word_embeddings=True)  # fmt: skip
        model = (GatedDeltaNetForCausalLM(GatedDeltaNetConfig(**shared)) if cell == ["gdn"]
                 else KDAForCausalLM(KDAConfig(**shared)))  # fmt: skip
        info = {}
    model = model.to(DEVICE, dtype).eval()

    def run(ids, new):
        """(prefill seconds, decode seconds), split where the first new token reaches the streamer."""
        clock = FirstTokenClock()
        start = time.perf_counter()
        model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0, streamer=clock)
        synchronize()
        return clock.first - start, time.perf_counter() - clock.first

    return run, info


class FirstTokenClock:
    """A transformers streamer that notes when the first new token arrives (``put`` gets the prompt, then each new
    token on the host: the device has finished the prefill)."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, tokens):
        self.calls += 1
        if self.calls == 2:
            self.first = time.perf_counter()

    def end(self):
        pass


def synchronize():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@pytest.mark.parametrize("setting", SETTINGS, ids=[f"{b}x{p}x{n}" for b, p, n in SETTINGS])
@pytest.mark.parametrize("name", MODELS)
def test_generate(benchmark, name, setting):
    batch, prompt, new = setting
    if time.time() > DEADLINE:
        pytest.skip("GENERATE_BENCH_DEADLINE passed (a benchmark cut short writes no results at all)")
    torch.manual_seed(0)
    run, info = build(name, batch, prompt)
    ids = torch.randint(1, VOCAB, (batch, prompt), device=DEVICE)
    with torch.no_grad():
        run(ids, new)  # warm-up: kernels compile and autotune, the CUDA graph is captured
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timings = []
        benchmark.pedantic(lambda: timings.append(run(ids, new)), rounds=ROUNDS, iterations=1)
    prefill_s = statistics.median(prefill for prefill, _ in timings)
    decode_s = statistics.median(decode for _, decode in timings)
    benchmark.extra_info.update(
        kind="generate", model=name, batch=batch, prompt=prompt, new=new, prefill_s=prefill_s,
        ms_per_step=decode_s / (new - 1) * 1e3, decode_tokens_per_s=batch * (new - 1) / decode_s,
        peak_gib=torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None,
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu", **info,
    )  # fmt: skip


@pytest.mark.parametrize("cell", ["gdn"])
def test_bf16_state_agreement(benchmark, cell):
    """Greedy tokens of ``Engine(state_dtype=torch.bfloat16)`` against the fp32 state, 340M (random weights), bf16
    weights, ``GENERATE_STATE_AGREEMENT`` = BxPxN (default 8 prompts of 512 tokens, 1024 new tokens each): the
    fraction of equal tokens and where each row first differs."""
    import linrnn

    batch, prompt, new = map(int, os.environ.get("GENERATE_STATE_AGREEMENT", "8x512x1024").split("x"))
    if time.time() > DEADLINE:
        pytest.skip("GENERATE_BENCH_DEADLINE passed (a benchmark cut short writes no results at all)")
    torch.manual_seed(0)
    if DEVICE == "cuda":
        model = linrnn.build_model(CELLS[cell], preset="340m")
    else:
        model = linrnn.build_model(CELLS[cell], vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS,
                                   num_heads=HEADS, intermediate_size=MLP)  # fmt: skip
    model = model.to(DEVICE, torch.bfloat16 if DEVICE == "cuda" else torch.float32).eval()
    ids = list(torch.randint(1, VOCAB, (batch, prompt), device=DEVICE))
    greedy = linrnn.Sampling(max_new_tokens=new, temperature=0)
    with torch.no_grad():
        fp32 = [r.tokens for r in linrnn.Engine(model, slots=batch).generate(ids, greedy)]
        engine = linrnn.Engine(model, slots=batch, state_dtype=torch.bfloat16)
        bf16 = benchmark.pedantic(lambda: [r.tokens for r in engine.generate(ids, greedy)], rounds=1, iterations=1)
    equal = sum(a == b for x, y in zip(fp32, bf16, strict=True) for a, b in zip(x, y, strict=True))
    first = [next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), new)
             for x, y in zip(fp32, bf16, strict=True)]  # fmt: skip
    benchmark.extra_info.update(
        kind="state_agreement", model=f"linrnn {cell}", batch=batch, prompt=prompt, new=new,
        equal_fraction=equal / (batch * new), first_difference=first,
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
    )  # fmt: skip


API_NAMES = {"generate": "linrnn.generate() gdn", "engine": "Engine kept, gdn", "loop": "token loop (former) gdn"}


@pytest.mark.parametrize("setting", API_SETTINGS, ids=[f"{b}x{p}x{n}" for b, p, n in API_SETTINGS])
@pytest.mark.parametrize("impl", list(API_NAMES))
def test_generate_function(benchmark, impl, setting):
    """``linrnn.generate()`` against a kept ``Engine`` and the former loop, greedy (module docstring)."""
    import linrnn
    from tests.models.reference_generate import reference_generate

    batch, prompt, new = setting
    if time.time() > DEADLINE:
        pytest.skip("GENERATE_BENCH_DEADLINE passed (a benchmark cut short writes no results at all)")
    torch.manual_seed(0)
    if DEVICE == "cuda":
        model = linrnn.build_model("gdn", preset="340m")
    else:
        model = linrnn.build_model("gdn", vocab_size=VOCAB, hidden_size=HIDDEN, num_layers=LAYERS, num_heads=HEADS,
                                   intermediate_size=MLP)  # fmt: skip
    model = model.to(DEVICE, torch.bfloat16 if DEVICE == "cuda" else torch.float32).eval()
    ids = torch.randint(1, VOCAB, (batch, prompt), device=DEVICE)
    engine = linrnn.Engine(model, slots=batch) if impl == "engine" else None

    def call(tokens: int) -> float:
        """Seconds for one greedy call making ``tokens`` new tokens per prompt."""
        synchronize()
        start = time.perf_counter()
        if impl == "generate":
            linrnn.generate(model, ids, tokens, temperature=0)
        elif impl == "engine":
            engine.generate(list(ids), linrnn.Sampling(max_new_tokens=tokens, temperature=0))
        else:
            reference_generate(model, ids, tokens, temperature=0)
        synchronize()
        return time.perf_counter() - start

    with torch.no_grad():
        call(new), call(1)  # warm-up: kernels compile and autotune (a kept engine also captures its graph)
        if DEVICE == "cuda":
            torch.cuda.reset_peak_memory_stats()
        timings = []
        benchmark.pedantic(lambda: timings.append((call(1), call(new))), rounds=ROUNDS, iterations=1)
    prefill_s = statistics.median(first for first, _ in timings)
    decode_s = statistics.median(whole - first for first, whole in timings)
    benchmark.extra_info.update(
        kind="generate", model=API_NAMES[impl], batch=batch, prompt=prompt, new=new, prefill_s=prefill_s,
        ms_per_step=decode_s / (new - 1) * 1e3, decode_tokens_per_s=batch * (new - 1) / decode_s,
        call_s=statistics.median(whole for _, whole in timings),
        peak_gib=torch.cuda.max_memory_allocated() / 2**30 if DEVICE == "cuda" else None,
        device=torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu",
    )  # fmt: skip
