"""The generation engine (``linrnn.inference``): greedy tokens equal the argmax of the full forward for every cell;
a request gets the same tokens alone, in a batch of other lengths, and when slots are refilled mid-run (continuous
batching), greedy and sampled; the sampling options; CUDA graphs against plain steps on the GPU."""

import importlib.util

import pytest
import torch

import linrnn
from linrnn.errors import UsageError
from linrnn.inference import Engine, Sampling, decode_one, sample

CELLS = linrnn.list_cells()


def tiny(cell, **options):
    torch.manual_seed(0)
    return linrnn.build_model(cell, preset="byte-tiny", num_layers=2, **options).double()


def prompts(*lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("cell, options", [*((cell, {}) for cell in CELLS), ("gated_deltanet", {"use_rope": True})])
def test_greedy_tokens_are_the_argmax_of_the_full_forward(cell, options):
    model = tiny(cell, **options)
    (prompt,) = prompts(7)
    engine = Engine(model, slots=1)
    (request,) = engine.generate([prompt], Sampling(max_new_tokens=6, temperature=0))
    assert len(request.tokens) == 6 and request.finish_reason == "length"
    sequence = torch.cat([prompt, torch.tensor(request.tokens)])
    with torch.no_grad():
        logits, state = model(sequence[None, :-1], return_state=True)
    assert request.tokens == logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    for slot_state, full in zip(engine.states, state, strict=True):  # the slot holds the state after all but the last
        torch.testing.assert_close(slot_state.recurrent, full.recurrent, rtol=1e-10, atol=1e-12)
        for name, history in full.conv.items():
            torch.testing.assert_close(slot_state.conv[name], history, rtol=1e-10, atol=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet"])
def test_engine_on_the_triton_kernels(cell):
    """The decoding kernels (``short_conv_step``, the fused recurrent kernel updating the slot's state in place) in
    fp32, compiled on CUDA or interpreted on the CPU: two requests in two slots give the full forward's argmax."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=1, backend="triton").to(device)
    batch = [p.to(device) for p in prompts(5, 3)]
    engine = Engine(model, slots=2, cuda_graph=False)
    engine._lookahead = 0  # the slots' states are read after the run: no step queued past the last token
    requests = engine.generate(batch, Sampling(max_new_tokens=4, temperature=0))
    for slot, (prompt, request) in enumerate(zip(batch, requests, strict=True)):
        sequence = torch.cat([prompt, torch.tensor(request.tokens, device=device)])
        with torch.no_grad():
            logits, state = model(sequence[None, :-1], return_state=True)
        assert request.tokens == logits[0, len(prompt) - 1 :].argmax(-1).tolist()
        for slot_state, full in zip(engine.states, state, strict=True):  # the state after all but the last token
            torch.testing.assert_close(slot_state.recurrent[slot], full.recurrent[0], rtol=1e-4, atol=1e-5)
            for name, history in full.conv.items():
                torch.testing.assert_close(slot_state.conv[name][slot], history[0], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet"])
@pytest.mark.parametrize("options", [{}, {"use_rope": True}], ids=["plain", "rope"])
def test_a_batch_and_refilled_slots_give_each_request_its_own_tokens(cell, options):
    """Five requests of different prompt lengths, budgets and sampling through two slots (slots are refilled as
    requests end), and through four slots with several prompts packed per prefill, against each request alone."""
    model = tiny(cell, **options)
    batch = prompts(3, 9, 1, 5, 12)
    settings = [Sampling(max_new_tokens=n, temperature=t, top_k=k, top_p=p, seed=s)
                for n, t, k, p, s in [(4, 0, None, None, 0), (7, 0.8, None, 0.9, 3), (2, 1.0, 5, None, 1),
                                      (6, 0, None, None, 0), (3, 1.3, 20, 0.95, 8)]]  # fmt: skip
    together = Engine(model, slots=2).generate(batch, settings)
    packed = Engine(model, slots=4, prefill_tokens=10).generate(batch, settings)  # prefills of 1–3 prompts
    alone = [Engine(model, slots=1).generate([p], [s])[0] for p, s in zip(batch, settings, strict=True)]
    assert [r.tokens for r in together] == [r.tokens for r in alone] == [r.tokens for r in packed]
    assert [len(r.tokens) for r in together] == [4, 7, 2, 6, 3]


@pytest.mark.parametrize("cell", ["gated_deltanet", "attention"])
def test_a_step_queued_ahead_gives_the_same_tokens(cell):
    """On CUDA the engine queues step t + 1 before it reads step t's tokens, so a request that ended at step t is
    decoded once more and its slot may be refilled before that step's tokens are read. Forced here on the CPU:
    requests ending by stop token and by length through refilled slots, greedy and sampled, get the tokens of the
    engine that reads every step before the next."""
    model = tiny(cell)
    batch = prompts(3, 9, 1, 5, 12, 4)
    greedy = [r.tokens for r in Engine(model, slots=1).generate(batch, Sampling(max_new_tokens=9, temperature=0))]
    settings = [Sampling(max_new_tokens=9, temperature=0, stop_tokens=(greedy[0][2],)),
                Sampling(max_new_tokens=5, temperature=0.8, seed=2),
                Sampling(max_new_tokens=9, temperature=0, stop_tokens=(greedy[2][0],)),
                Sampling(max_new_tokens=9, temperature=0, stop_tokens=(greedy[3][4],)),
                Sampling(max_new_tokens=3, temperature=1.1, top_k=9, seed=5),
                Sampling(max_new_tokens=7, temperature=0)]  # fmt: skip
    at_once = Engine(model, slots=2).generate(batch, settings)
    ahead = Engine(model, slots=2)
    ahead._lookahead = 1
    queued = ahead.generate(batch, settings)
    assert [(r.tokens, r.finish_reason) for r in queued] == [(r.tokens, r.finish_reason) for r in at_once]
    assert {r.finish_reason for r in queued} == {"stop", "length"}


def test_stream_yields_tokens_as_they_come():
    model = tiny("gdn")
    engine = Engine(model, slots=3)
    events = list(engine.stream(prompts(4, 6), Sampling(max_new_tokens=3, temperature=0)))
    assert sorted(i for i, _ in events) == [0, 0, 0, 1, 1, 1]
    assert events[:2] == [(0, events[0][1]), (1, events[1][1])]  # both prefilled before the first step


def test_sampling_options():
    model = tiny("kda")
    (prompt,) = prompts(5)
    engine = Engine(model, slots=1)

    def tokens(**settings):
        return engine.generate([prompt], Sampling(max_new_tokens=8, **settings))[0].tokens

    greedy = tokens(temperature=0)
    assert tokens(temperature=1.5, top_k=1) == greedy  # one candidate
    assert tokens(temperature=1.5, top_p=1e-6) == greedy  # the most likely token alone holds the mass
    assert tokens(temperature=1.0, seed=4) == tokens(temperature=1.0, seed=4)
    assert tokens(temperature=1.0, seed=4) != tokens(temperature=1.0, seed=5)
    stopped = engine.generate([prompt], Sampling(max_new_tokens=8, temperature=0, stop_tokens=(greedy[3],)))[0]
    assert stopped.tokens == greedy[: greedy.index(greedy[3])] and stopped.finish_reason == "stop"
    assert engine.generate([prompt], Sampling(max_new_tokens=0))[0].tokens == []


def test_sample_draws_by_probability():
    """Gumbel-max over the hashed noise: the frequencies of 4000 draws follow the softmax (temperature 0.5)."""
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]]).expand(4000, 4)
    rows = torch.ones(4000)
    drawn = sample(logits, 0.5 * rows, torch.zeros(4000, dtype=torch.long), rows, torch.arange(4000) * 7,
                   torch.zeros(4000, dtype=torch.long))  # fmt: skip
    frequencies = torch.bincount(drawn, minlength=4).double() / 4000
    torch.testing.assert_close(frequencies, (logits[0] / 0.5).double().softmax(-1), atol=0.03, rtol=0)


def test_changed_parameters_drop_the_captured_graphs():
    """A graph replays the tensors it captured, the projections' cached concatenated weight among them: after an
    in-place parameter update the next run must capture again (checked here without CUDA, on the bookkeeping)."""
    model = tiny("gdn")
    engine = Engine(model, slots=1)
    engine._graphs, engine._captured_parameters = {True: "captured"}, engine._parameters()
    engine.generate(prompts(3), Sampling(max_new_tokens=2, temperature=0))
    assert engine._graphs == {True: "captured"}  # unchanged parameters: kept
    with torch.no_grad():
        model.layers[0].mixer.q_proj.weight.mul_(0.5)
    engine.generate(prompts(3), Sampling(max_new_tokens=2, temperature=0))
    assert engine._graphs == {}


@pytest.mark.parametrize("cell", ["gated_deltanet", "gammanet", "mamba2"])
def test_bf16_state_decodes_as_the_model_with_its_state_rounded_after_each_step(cell):
    """``state_dtype=torch.bfloat16``: prefill in fp32, then each step computes in fp32 from the bf16 state and
    rounds the new one: the tokens of decoding with the model's own fp32 state rounded to bf16 after every call."""
    model = tiny(cell)
    prompt, new = torch.randint(1, 256, (11,), generator=torch.Generator().manual_seed(1)), 24
    engine = Engine(model, slots=1, state_dtype=torch.bfloat16)
    tokens = engine.generate([prompt], Sampling(max_new_tokens=new, temperature=0))[0].tokens
    assert all(layer.recurrent.dtype == torch.bfloat16 for layer in engine.states)
    expected = []
    with torch.no_grad():
        logits, state = model(prompt[None], return_state=True)
        for _ in range(new):
            expected.append(int(logits[0, -1].argmax()))
            for layer in state:
                layer.recurrent = layer.recurrent.bfloat16().float()
            logits, state = model(torch.tensor([[expected[-1]]]), state=state, return_state=True)
    assert tokens == expected


def test_engine_errors():
    model = tiny("gdn")
    with pytest.raises(UsageError, match="'state_dtype' must be None or torch.bfloat16, got torch.float16"):
        Engine(model, state_dtype=torch.float16)
    with pytest.raises(UsageError, match="'slots' must be an int >= 1, got 0"):
        Engine(model, slots=0)
    with pytest.raises(UsageError, match="'prefill_tokens' must be an int >= 1, got 0"):
        Engine(model, prefill_tokens=0)
    engine = Engine(model, slots=1)
    with pytest.raises(UsageError, match=r"prompt 0 must be a \[T\] token tensor"):
        engine.generate([torch.zeros(1, 3, dtype=torch.long)])
    with pytest.raises(UsageError, match=r"expected token ids in \[0, vocab_size = 256\), got 300"):
        engine.generate([torch.tensor([1, 300])])
    with pytest.raises(UsageError, match="one Sampling or one per prompt"):
        engine.generate(prompts(2, 2), [Sampling()])
    with pytest.raises(ValueError, match="top_p"):
        Sampling(top_p=1.5)


@pytest.mark.gpu
@pytest.mark.parametrize("cell", CELLS)
def test_cuda_graph_equals_plain_steps(cell):
    torch.manual_seed(0)
    model = linrnn.build_model(cell, preset="byte-tiny", num_layers=2).cuda().to(torch.bfloat16)
    batch = [p.cuda() for p in prompts(5, 30, 2, 17)]
    for settings in (
        Sampling(max_new_tokens=12, temperature=0),
        Sampling(max_new_tokens=9, temperature=0.9, top_k=50, seed=3),
    ):
        graphs = Engine(model, slots=3, cuda_graph=True).generate(batch, settings)
        plain = Engine(model, slots=3, cuda_graph=False).generate(batch, settings)
        assert [r.tokens for r in graphs] == [r.tokens for r in plain]


@pytest.mark.parametrize("setting", [Sampling(max_new_tokens=7, temperature=0),
                                     Sampling(max_new_tokens=7, temperature=0.9, top_p=0.9, seed=3),
                                     Sampling(max_new_tokens=7, temperature=1.0, stop_tokens=(17, 101))])  # fmt: skip
def test_decode_one_gives_the_engines_tokens(setting):
    """The loop for models the engine refuses samples as the engine does: the same request, the same tokens."""
    model = tiny("gated_deltanet")
    for prompt in prompts(5, 9):
        (expected,) = Engine(model, slots=2).generate([prompt], setting)
        request = decode_one(model, prompt, setting)
        assert (request.tokens, request.finish_reason) == (expected.tokens, expected.finish_reason)


def test_decode_one_on_attention_is_the_argmax_of_the_full_forward():
    """Attention's KV cache grows token by token: greedy tokens equal the full forward's argmax."""
    model = tiny("attention")
    (prompt,) = prompts(6)
    request = decode_one(model, prompt, Sampling(max_new_tokens=8, temperature=0))
    assert len(request.tokens) == 8 and request.finish_reason == "length"
    sequence = torch.cat([prompt, torch.tensor(request.tokens)])
    with torch.no_grad():
        logits = model(sequence[None, :-1])
    assert request.tokens == logits[0, len(prompt) - 1 :].argmax(-1).tolist()
    assert decode_one(model, prompt, Sampling(max_new_tokens=0)).tokens == []
    with pytest.raises(UsageError, match="argument 'prompt' must be a \\[T\\] token tensor, got Tensor \\[1, 6\\]"):
        decode_one(model, prompt[None])
