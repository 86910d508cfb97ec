"""The generation engine on models with attention layers (a 3:1 Gated DeltaNet hybrid, pure attention): each slot's
KV cache is preallocated to ``max_length`` positions; greedy tokens equal the full forward's argmax with slots reused
by later, shorter requests; sampled tokens equal ``decode_one``'s; a request longer than the cache is refused
before anything runs; CUDA graphs against plain steps on the GPU."""

import pytest
import torch

import linrnn
from linrnn.errors import UsageError
from linrnn.inference import Engine, Sampling, decode_one
from linrnn.recurrences.base import MixerState

PATTERN = ["gdn", "gdn", "gdn", "attention"]
MODELS = {"hybrid": ("gdn", {"layer_pattern": PATTERN}), "attention": ("attention", {})}


def tiny(kind, **options):
    """4 layers; init_std 0.2 so that greedy tokens follow the context (at 0.02 a random model repeats one token)."""
    cell, extra = MODELS[kind]
    torch.manual_seed(0)
    return linrnn.build_model(cell, preset="byte-tiny", num_layers=4, init_std=0.2, **extra, **options).double()


def prompts(*lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("kind", MODELS)
def test_greedy_tokens_are_the_argmax_of_the_full_forward_with_slots_reused(kind):
    """Six requests through two slots, the long ones first: every later request lands in a slot whose cache holds
    an earlier request's keys past its own length. Each new token is the argmax of the full forward at the position
    before it (teacher forcing), and the last slot's cache holds the forward's keys and values."""
    model = tiny(kind)
    batch = prompts(11, 9, 1, 6, 3, 4)
    budgets = [8, 3, 9, 2, 7, 5]
    engine = Engine(model, slots=2, max_length=20, prefill_tokens=12)
    requests = engine.generate(batch, [Sampling(max_new_tokens=n, temperature=0) for n in budgets])
    assert [len(r.tokens) for r in requests] == budgets
    for prompt, request in zip(batch, requests, strict=True):
        sequence = torch.cat([prompt, torch.tensor(request.tokens)])
        with torch.no_grad():
            logits = model(sequence[None, :-1])[0]
        assert request.tokens == logits[len(prompt) - 1 :].argmax(-1).tolist()
    # one slot alone, after a longer request: its cache's valid prefix is the forward's KV cache (stale entries past)
    engine = Engine(model, slots=1, max_length=20)
    engine.generate(batch[:1], Sampling(max_new_tokens=8, temperature=0))
    prompt = batch[4]
    (request,) = engine.generate([prompt], Sampling(max_new_tokens=7, temperature=0))
    sequence = torch.cat([prompt, torch.tensor(request.tokens)])
    with torch.no_grad():
        _, state = model(sequence[None, :-1], return_state=True)
    seen = len(sequence) - 1
    assert engine.positions.tolist() == [seen]
    for slot_state, full in zip(engine.states, state, strict=True):
        if full.kv is not None:
            for cache, expected in zip(slot_state.kv, full.kv, strict=True):
                torch.testing.assert_close(cache[:, :, :seen], expected, rtol=1e-12, atol=1e-12)
                assert cache[:, :, seen:].abs().sum() > 0  # the earlier request's entries are still there, unread


@pytest.mark.parametrize("kind", MODELS)
def test_sampled_tokens_equal_decode_one(kind):
    """Temperature, top-k, top-p, seeds and a stop token, five requests in two slots: each request gets
    ``decode_one``'s tokens (the model's own growing cache, one request at a time)."""
    model = tiny(kind)
    batch = prompts(5, 12, 2, 8, 3, seed=2)
    settings = [Sampling(max_new_tokens=n, temperature=t, top_k=k, top_p=p, seed=s, stop_tokens=stop)
                for n, t, k, p, s, stop in [(6, 0.8, None, 0.9, 3, ()), (4, 1.0, 20, None, 1, ()),
                                            (9, 1.3, None, 0.95, 8, ()), (5, 0, None, None, 0, ()),
                                            (7, 1.0, None, None, 4, (17, 101))]]  # fmt: skip
    requests = Engine(model, slots=2, max_length=24).generate(batch, settings)
    alone = [decode_one(model, prompt, setting) for prompt, setting in zip(batch, settings, strict=True)]
    assert [(r.tokens, r.finish_reason) for r in requests] == [(r.tokens, r.finish_reason) for r in alone]
    assert sum(len(r.tokens) for r in requests) > 20


def test_in_place_cache_with_stale_entries_equals_the_forward():
    """The mixer alone on fixed buffers full of noise (a reused slot): fed in pieces of 1 to 5 tokens from position
    0, its outputs are the full forward's, and the buffers' prefix is the returned cache's."""
    torch.manual_seed(0)
    mixer = linrnn.build_mixer("attention", 48, 3).double()
    x = torch.randn(2, 12, 48, dtype=torch.float64)
    full, cache = mixer(x, output_state=True)
    buffers = tuple(torch.randn(2, 3, 16, mixer.head_k_dim, dtype=torch.float64) for _ in range(2))
    position = torch.zeros(2, dtype=torch.long)
    state = MixerState(kv=buffers, position=position, in_place=True)
    outputs = []
    for start, end in [(0, 5), (5, 6), (6, 9), (9, 12)]:
        y, returned = mixer(x[:, start:end], state)
        assert returned is state
        position += end - start  # the caller advances the position
        outputs.append(y)
    torch.testing.assert_close(torch.cat(outputs, dim=1), full, rtol=1e-12, atol=1e-12)
    for buffer, expected in zip(buffers, cache.kv, strict=True):
        torch.testing.assert_close(buffer[:, :, :12], expected, rtol=1e-12, atol=1e-12)


def test_capacity_is_checked_before_anything_runs():
    model = tiny("hybrid")
    engine = Engine(model, slots=1, max_length=10)
    short, long = prompts(6, 7)
    message = (
        r"Engine: request 1 needs len\(prompt\) \+ max_new_tokens = 7 \+ 4 = 11 KV-cache positions, more than "
        r"argument 'max_length' = 10 .*expected at most 10: pass Engine\(\.\.\., max_length=11\)"
    )
    with pytest.raises(UsageError, match=message):
        engine.generate([short, long], Sampling(max_new_tokens=4, temperature=0))
    (request,) = engine.generate([short], Sampling(max_new_tokens=4, temperature=0))  # 6 + 4: exactly full
    sequence = torch.cat([short, torch.tensor(request.tokens)])
    with torch.no_grad():
        assert request.tokens == model(sequence[None, :-1])[0, 5:].argmax(-1).tolist()
    with pytest.raises(UsageError, match="argument 'max_length' must be an int >= 1, got 0"):
        Engine(model, max_length=0)


def test_a_model_without_attention_keeps_no_cache_and_takes_any_length():
    torch.manual_seed(0)
    model = linrnn.build_model("gdn", preset="byte-tiny", num_layers=2).double()
    engine = Engine(model, slots=1, max_length=4)
    assert engine.max_length is None and all(state.kv is None for state in engine.states)
    (request,) = engine.generate(prompts(6), Sampling(max_new_tokens=5, temperature=0))
    assert len(request.tokens) == 5


@pytest.mark.gpu
@pytest.mark.parametrize("kind", MODELS)
def test_cuda_graph_equals_plain_steps(kind):
    cell, extra = MODELS[kind]
    torch.manual_seed(0)
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=4, init_std=0.2, **extra)
    model = model.cuda().to(torch.bfloat16)
    batch = [p.cuda() for p in prompts(5, 30, 2, 17, 9)]
    for settings in (
        Sampling(max_new_tokens=12, temperature=0),
        Sampling(max_new_tokens=9, temperature=0.9, top_k=50, seed=3),
    ):
        graphs = Engine(model, slots=3, cuda_graph=True, max_length=48).generate(batch, settings)
        plain = Engine(model, slots=3, cuda_graph=False, max_length=48).generate(batch, settings)
        assert [r.tokens for r in graphs] == [r.tokens for r in plain]
