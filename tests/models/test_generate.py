"""``linrnn.generate`` through the engine: its tokens equal ``Engine``'s and the former token-by-token loop's
(tests/models/reference_generate.py) greedy, for one prompt, a batch, a list of prompts of different lengths and a
3:1 hybrid with attention layers; seeded sampling equals the engine's with the same seeds, and its distribution is the
loop's; a generator or torch's global seed make calls repeatable; stop tokens end a row (filled with the stop token
in a tensor, cut in a list); bad arguments are ``UsageError``s naming the argument."""

import pytest
import torch

import linrnn
import linrnn.inference
import linrnn.models
from linrnn.errors import UsageError
from linrnn.inference import Engine, Sampling, decode_one
from tests.models.reference_generate import next_token_probabilities, reference_generate

HYBRID = ["gdn", "gdn", "gdn", "attention"]


def tiny(**options):
    """float64; init_std 0.2 so that greedy tokens follow the context (at 0.02 a random model repeats one token)."""
    torch.manual_seed(0)
    options = {"num_layers": 2, "init_std": 0.2, **options}
    return linrnn.build_model("gdn", preset="byte-tiny", **options).double()


def prompts(*lengths, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (n,), generator=gen) for n in lengths]


def engine_tokens(model, batch, sampling):
    """Each prompt alone through an engine of one slot: its new tokens."""
    settings = sampling if isinstance(sampling, list) else [sampling] * len(batch)
    return [Engine(model, slots=1).generate([p], s)[0].tokens for p, s in zip(batch, settings, strict=True)]


def test_one_function_everywhere():
    assert linrnn.generate is linrnn.models.generate is linrnn.inference.generate
    from linrnn.models import generate

    assert generate is linrnn.generate


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_equals_the_engine_and_the_reference_loop(batch):
    model = tiny()
    ids = torch.stack(prompts(*[7] * batch))
    prompt = ids[0] if batch == 1 else ids  # [T] for one prompt, [B, T] for three
    out = linrnn.generate(model, prompt, 9, temperature=0)
    assert out.shape == ((16,) if batch == 1 else (3, 16)) and out.dtype == torch.long
    assert torch.equal(out, reference_generate(model, prompt, 9, temperature=0))
    rows = out.reshape(batch, -1)
    assert [row[7:].tolist() for row in rows] == engine_tokens(model, list(ids), Sampling(max_new_tokens=9,
                                                                                          temperature=0))  # fmt: skip
    assert len(set(rows[:, 7:].flatten().tolist())) > 3  # the tokens vary: the comparison means something


def test_a_list_of_prompts_of_different_lengths():
    model = tiny()
    batch = prompts(3, 11, 6)
    out = linrnn.generate(model, batch, 5, temperature=0)
    assert isinstance(out, list) and [len(row) for row in out] == [8, 16, 11]
    for prompt, row in zip(batch, out, strict=True):
        assert torch.equal(row, reference_generate(model, prompt, 5, temperature=0))
    assert torch.equal(linrnn.generate(model, tuple(batch[:1]), 5, temperature=0)[0], out[0])


def test_a_hybrid_with_attention_layers(monkeypatch):
    """The engine's KV cache is sized to the longest prompt + max_new_tokens; tokens equal the reference loop's
    (the model's own growing cache) and ``decode_one``'s when sampled."""
    model = tiny(num_layers=4, layer_pattern=HYBRID)
    sizes = []
    init = Engine.__init__
    monkeypatch.setattr(Engine, "__init__", lambda self, *a, **k: sizes.append(k["max_length"]) or init(self, *a, **k))
    batch = prompts(4, 13, 7, seed=3)
    out = linrnn.generate(model, batch, 6, temperature=0)
    assert sizes == [13 + 6]
    for prompt, row in zip(batch, out, strict=True):
        assert torch.equal(row, reference_generate(model, prompt, 6, temperature=0))
    sampled = linrnn.generate(model, torch.stack(prompts(5, 5, seed=4)), 7, temperature=0.9, top_p=0.9, seed=11)
    for i, row in enumerate(sampled):
        alone = decode_one(model, row[:5], Sampling(max_new_tokens=7, temperature=0.9, top_p=0.9, seed=11 + i))
        assert row[5:].tolist() == alone.tokens


def test_seeded_sampling_equals_the_engine_with_the_same_seeds():
    """Row i draws with seed + i: the engine's tokens for that prompt alone with Sampling(seed=seed + i)."""
    model = tiny()
    batch = prompts(6, 6, 6, seed=2)
    options = dict(temperature=0.9, top_k=20, top_p=0.95)
    out = linrnn.generate(model, torch.stack(batch), 8, **options, seed=40)
    expected = engine_tokens(model, batch, [Sampling(max_new_tokens=8, **options, seed=40 + i) for i in range(3)])
    assert [row[6:].tolist() for row in out] == expected
    assert len({tuple(tokens) for tokens in expected}) == 3  # the rows differ
    listed = linrnn.generate(model, batch, 8, **options, seed=40)
    assert [row.tolist() for row in listed] == out.tolist()
    assert linrnn.generate(model, batch[0], 8, **options, seed=40)[6:].tolist() == expected[0]


def test_generator_and_global_seed_make_calls_repeatable():
    model = tiny()
    (prompt,) = prompts(5)

    def sample(**options):
        return linrnn.generate(model, prompt, 10, temperature=1.0, **options)[5:].tolist()

    generator = torch.Generator().manual_seed(7)
    first, second = sample(generator=generator), sample(generator=generator)  # the generator advances
    assert first != second
    drawn = int(torch.randint(0, 2**31, (1,), generator=torch.Generator().manual_seed(7)))
    assert first == sample(generator=torch.Generator().manual_seed(7)) == sample(seed=drawn)
    torch.manual_seed(3)
    global_first = sample()
    torch.manual_seed(3)
    assert sample() == global_first
    generator = torch.Generator().manual_seed(7)
    linrnn.generate(model, prompt, 4, temperature=0, generator=generator)  # greedy draws nothing
    assert torch.equal(generator.get_state(), torch.Generator().manual_seed(7).get_state())


def test_sampled_tokens_follow_the_reference_distribution():
    """2,000 rows of one prompt, one new token each (seeds 0 … 1999): the frequencies are the reference loop's
    softmax(logits / temperature) among the top_k, within sampling error (total variation 0.015; the distribution
    at temperature 1 is 0.17 away); top_k = 1 is greedy."""
    model = tiny()
    (prompt,) = prompts(1, seed=6)
    rows = 2000
    out = linrnn.generate(model, prompt.expand(rows, 1), 1, temperature=0.7, top_k=8, seed=0)
    expected = next_token_probabilities(model, prompt, 0.7, top_k=8)
    frequencies = torch.bincount(out[:, 1], minlength=256).double() / rows
    assert set(out[:, 1].tolist()) <= set(expected.nonzero().flatten().tolist())
    assert 0.5 * (frequencies - expected).abs().sum() < 0.05
    assert 0.5 * (next_token_probabilities(model, prompt, 1.0, top_k=8) - expected).abs().sum() > 0.1
    greedy = linrnn.generate(model, prompt, 6, temperature=0)
    assert torch.equal(linrnn.generate(model, prompt, 6, temperature=1.5, top_k=1, seed=9), greedy)


def test_stop_tokens_end_rows():
    """Each row ends at its first stop token: in a tensor it is filled with that stop token to the full width, in
    a list it is cut (the stop token left out); ``eos_token_id`` is the same; max_new_tokens stays the width."""
    model = tiny()
    ids = torch.stack(prompts(5, 5, 5, seed=6))
    free = reference_generate(model, ids, 12, temperature=0)[:, 5:].tolist()
    stops = (free[0][3], free[1][6])  # row 0 stops at its 4th new token, row 1 at its 7th at the latest
    out = linrnn.generate(model, ids, 12, temperature=0, stop_tokens=stops)
    assert out.shape == (3, 17)
    listed = linrnn.generate(model, list(ids), 12, temperature=0, eos_token_id=list(stops))
    ends = 0
    for row, cut, tokens in zip(out, listed, free, strict=True):
        end = next((n for n, token in enumerate(tokens) if token in stops), len(tokens))
        pad = [tokens[end]] * (12 - end) if end < len(tokens) else []
        assert row[5:].tolist() == tokens[:end] + pad
        assert cut[5:].tolist() == tokens[:end]
        ends += end < len(tokens)
    assert ends >= 2 and out[0, 5 + 3 :].eq(stops[0]).all()
    same = linrnn.generate(model, ids, 12, temperature=0, stop_tokens=stops[0], eos_token_id=stops[1])
    assert torch.equal(same, out)
    first = linrnn.generate(model, ids[0], 12, temperature=0, stop_tokens=free[0][0])  # stops at once
    assert first[5:].tolist() == [free[0][0]] * 12
    (cut,) = linrnn.generate(model, [ids[0]], 12, temperature=0, stop_tokens=free[0][0])
    assert torch.equal(cut, ids[0])


def test_zero_new_tokens_mode_and_dtypes():
    model = tiny()
    model.train()
    prompt = prompts(4)[0].to(torch.int32)
    assert torch.equal(linrnn.generate(model, prompt, 0), prompt.long())
    out = linrnn.generate(model, prompt, 3, temperature=0)
    assert model.training and out.dtype == torch.long and torch.equal(out[:4], prompt.long())


@pytest.mark.parametrize(
    "arguments, message",
    [
        (dict(max_new_tokens=-1), "argument 'max_new_tokens' must be an int >= 0, got -1"),
        (dict(max_new_tokens=2.0), "argument 'max_new_tokens' must be an int >= 0, got 2.0"),
        (dict(temperature=-0.5), "argument 'temperature' must be a number >= 0 .*, got -0.5"),
        (dict(temperature="hot"), "argument 'temperature' must be a number >= 0 .*, got 'hot'"),
        (dict(top_k=0), "argument 'top_k' must be None or an int >= 1, got 0"),
        (dict(top_p=1.5), r"argument 'top_p' must be None or a number in \(0, 1\], got 1.5"),
        (dict(top_p=0), r"argument 'top_p' must be None or a number in \(0, 1\], got 0"),
        (dict(stop_tokens=256), r"argument 'stop_tokens': expected token ids in \[0, vocab_size = 256\), got 256"),
        (dict(stop_tokens="</s>"), "argument 'stop_tokens' must be a token id or a sequence of token ids, got '</s>'"),
        (dict(eos_token_id=[1, -2]), r"argument 'eos_token_id': expected token ids in \[0, .*\), got -2"),
        (dict(seed=-1), r"argument 'seed' must be None or an int in \[0, 2\*\*31\), got -1"),
        (dict(seed=2**31), r"argument 'seed' must be None or an int in \[0, 2\*\*31\), got 2147483648"),
        (dict(generator=7), "argument 'generator' must be None or a torch.Generator, got int"),
        (dict(seed=1, generator=torch.Generator()), "arguments 'seed' and 'generator' .* got both"),
        (dict(prompt_ids=[]), "argument 'prompt_ids' must hold at least one prompt, got an empty list"),
        (dict(prompt_ids=[torch.tensor([1]), torch.tensor([[3]])]), r"argument 'prompt_ids\[1\]' must be .* \[T\]"),
        (dict(prompt_ids=[torch.tensor([1, 300])]), r"argument 'prompt_ids\[0\]': expected token ids .*got 300"),
        (dict(prompt_ids=torch.zeros(2, 2, 2, dtype=torch.long)), "argument 'prompt_ids' must be an integer tensor"),
        (dict(model=torch.nn.Linear(2, 2)), "argument 'model' must be a linrnn LanguageModel.*, got Linear"),
    ],
)
def test_bad_arguments_name_the_argument(arguments, message):
    call = {"model": tiny(), "prompt_ids": torch.tensor([1, 2, 3]), "max_new_tokens": 4, **arguments}
    with pytest.raises(UsageError, match=f"^generate: {message}"):
        linrnn.generate(**call)


def test_the_engine_is_kept_for_calls_of_the_same_batch_size(monkeypatch):
    """A second call with as many prompts reuses the first call's engine (on CUDA its captured graph), a call with
    another batch size or a longer cache makes a new one; the tokens are those of fresh engines either way."""
    model = tiny(layer_pattern=HYBRID, num_layers=4)
    made = []
    real = linrnn.inference.Engine
    monkeypatch.setattr(linrnn.inference, "Engine", lambda *a, **k: made.append(k) or real(*a, **k))
    first = linrnn.generate(model, torch.stack(prompts(5, 5)), 4, temperature=0)
    again = linrnn.generate(model, torch.stack(prompts(5, 5, seed=2)), 4, temperature=0)
    assert len(made) == 1
    one = linrnn.generate(model, prompts(5)[0], 4, temperature=0)
    longer = linrnn.generate(model, prompts(5)[0], 20, temperature=0)
    assert [k["slots"] for k in made] == [2, 1, 1] and made[-1]["max_length"] == 25
    for out, batch, new in ((first, prompts(5, 5), 4), (again, prompts(5, 5, seed=2), 4), (one[None], prompts(5), 4),
                            (longer[None], prompts(5), 20)):  # fmt: skip
        assert [row[5:].tolist() for row in out] == engine_tokens(model, batch, Sampling(max_new_tokens=new,
                                                                                         temperature=0))  # fmt: skip
