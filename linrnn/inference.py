"""Generation engine: fixed batch slots with preallocated state, continuous batching, per-request sampling.

A linear RNN's decode state has a fixed size, so every decode step has the same shapes. ``Engine(model, slots)``
keeps, for every recurrence layer, the short-conv histories ``[slots, C, W − 1]`` and the recurrent state
``[slots, H, K, V]``, and each slot's position; the layers update them in place (``MixerState.in_place``). Attention
layers (a hybrid such as ``layer_pattern=["gdn", "gdn", "gdn", "attention"]``, or a pure attention model) keep a KV
cache preallocated to ``max_length`` positions per slot, ``[slots, H, max_length, K]`` for keys and for values: a
step writes each slot's new key and value at its position and attends over its first position + 1 entries (a mask
by length, so a reused slot never reads the previous request's keys), with the mixer's own RoPE and scaling. A
request needs len(prompt) + max_new_tokens ≤ ``max_length`` (``UsageError`` before anything runs otherwise); a model
without attention layers ignores ``max_length`` and takes any length. Waiting requests are prefilled together into
the free slots, their prompts packed as documents of one sequence (the chunkwise varlen kernels; at most
``prefill_tokens`` tokens per forward unless one prompt is longer), and their states (and keys and values) copied
into their slots; then one step advances every slot by one token (the fused recurrent kernel reads and writes each
slot's state once) — embedding, every layer, readout, sampling — and, on CUDA, that step is one CUDA graph replay
(captured on first use, once for all-greedy steps and once for sampling). Slots finish and take the next request
independently, without re-capturing. ``decode_one`` decodes one request at a time with the model's own growing state
and the same sampling: the reference the engine matches.

Sampling is per request: greedy (``temperature = 0``), temperature, top-k, top-p, stop tokens, a token budget and
a seed. The random draw for the n-th new token of a request is a function of (seed, n, token id) only — a
counter-based hash, not a generator's stream — so a request gets the same tokens alone, in any batch and in any
slot.

    engine = Engine(model, slots=8)
    for request_id, token in engine.stream([prompt_a, prompt_b], Sampling(temperature=0.8, top_p=0.95)):
        ...

``generate(model, prompt_ids, max_new_tokens, ...)`` (``linrnn.generate``) is the one-call form: the prompts of a
``[B, T]`` tensor or a list run through an engine of one slot per prompt and come back with their new tokens.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import Tensor

from linrnn.errors import UsageError
from linrnn.kernels import use_triton
from linrnn.kernels.validation import describe
from linrnn.models.config import ModelConfig
from linrnn.models.lm import LanguageModel, _check_prompt
from linrnn.recurrences.base import MixerState


class Sampling(BaseModel):
    """How one request picks its tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_new_tokens: int = Field(64, ge=0, description="new tokens at most (a stop token ends earlier)")
    temperature: float = Field(1.0, ge=0, description="0: greedy (argmax)")
    top_k: int | None = Field(None, ge=1, description="sample among the k most likely tokens")
    top_p: float | None = Field(None, gt=0, le=1, description="sample among the most likely tokens whose mass is p")
    stop_tokens: tuple[int, ...] = Field((), description="ids that end the request (not emitted)")
    seed: int = Field(0, ge=0, lt=2**31)


DEFAULT_SAMPLING = Sampling()


@dataclass
class Request:
    """A prompt and its sampling settings; ``tokens`` collects the new tokens, ``finish_reason`` is "stop" (a stop
    token, then in ``stop_token``) or "length" (``max_new_tokens``) once done."""

    id: int
    prompt: Tensor  # [T] int64
    sampling: Sampling
    tokens: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_token: int | None = None  # the stop token that ended it (not in ``tokens``)


def uniform_noise(seed: Tensor, counter: Tensor, vocab_size: int) -> Tensor:
    """``[S, V]`` uniform numbers in (0, 1) from 32-bit integer hashing of (seed, counter, token id), per row."""
    token = torch.arange(vocab_size, device=seed.device)
    x = (seed[:, None] * 1_000_003 + counter[:, None] * 7_919 + token[None, :]) & 0xFFFFFFFF
    for _ in range(3):  # below 2^32 · 2^27 throughout: no int64 overflow
        x = ((x ^ (x >> 16)) * 0x45D9F3B) & 0xFFFFFFFF
    x = x ^ (x >> 16)
    return ((x >> 8).to(torch.float32) + 0.5) / 2**24


def sample(logits: Tensor, temperature: Tensor, top_k: Tensor, top_p: Tensor, seed: Tensor, counter: Tensor) -> Tensor:
    """One token per row of ``logits`` ``[S, V]``: argmax where ``temperature`` is 0, else the Gumbel-max draw
    among the tokens that top-k (``top_k`` 0: all) and top-p (``top_p`` 1: all) keep. All per-row ``[S]``
    tensors, so the step has static shapes (a CUDA graph); the noise is ``uniform_noise(seed, counter)``."""
    logits = logits.float()
    vocab = logits.shape[-1]
    scaled = logits / temperature.clamp_min(1e-6)[:, None]
    ordered = scaled.sort(dim=-1, descending=True).values
    probs = ordered.softmax(dim=-1)
    rank = torch.arange(vocab, device=logits.device)
    keep = rank[None, :] < torch.where(top_k > 0, top_k, vocab)[:, None]
    keep &= (probs.cumsum(dim=-1) - probs) < top_p[:, None]  # the mass before a token; the first is always kept
    cutoff = torch.where(keep, ordered, float("inf")).min(dim=-1).values  # the smallest kept logit
    gumbel = -torch.log(-torch.log(uniform_noise(seed, counter, vocab)))
    drawn = torch.where(scaled >= cutoff[:, None], scaled + gumbel, float("-inf")).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, logits.argmax(dim=-1))


@torch.no_grad()
def decode_one(model: LanguageModel, prompt: Tensor, sampling: Sampling = DEFAULT_SAMPLING) -> Request:
    """One request decoded token by token with the model's own state (any layers: a KV cache grows), with
    ``Engine``'s sampling (the same ``sample`` and noise, so the same tokens as the engine); no slots and no length
    limit. Returns the finished request."""
    if not isinstance(sampling, Sampling):
        raise UsageError(f"decode_one: argument 'sampling' must be a linrnn.inference.Sampling, got "
                         f"{type(sampling).__name__}")  # fmt: skip
    if not isinstance(prompt, Tensor) or prompt.dim() != 1:
        raise UsageError(f"decode_one: argument 'prompt' must be a [T] token tensor, got "
                         f"{type(prompt).__name__} {list(getattr(prompt, 'shape', []))}")  # fmt: skip
    _check_prompt(prompt, model.config.vocab_size)
    device = next(model.parameters()).device
    request = Request(0, prompt.to(device, torch.long), sampling)
    was_training = model.training
    model.eval()
    values = (sampling.temperature, sampling.top_k or 0, sampling.top_p or 1.0, sampling.seed)
    per_request = [torch.tensor([value], device=device) for value in values]
    logits, state = model(request.prompt[None], return_state=True)
    while request.finish_reason is None and sampling.max_new_tokens > 0:
        counter = torch.tensor([len(request.tokens)], device=device)
        token = int(sample(logits[:, -1], *per_request, counter))
        if Engine._accept(request, token) is not None and request.finish_reason is None:
            logits, state = model(torch.tensor([[token]], device=device), state=state, return_state=True)
    if sampling.max_new_tokens == 0:
        request.finish_reason = "length"
    model.train(was_training)
    return request


DEFAULT_MAX_LENGTH = 2048  # Engine's KV-cache positions per slot, for models with attention layers


class Engine:
    """Continuous-batching generation over ``slots`` fixed slots (module docstring). ``cuda_graph`` (default: on
    for a CUDA model) captures the decode step once and replays it. ``max_length`` (default 2048): the positions of
    each slot's KV cache in attention layers, the longest prompt + ``max_new_tokens`` a request may have; memory
    2 · slots · max_length · H · K elements per attention layer. ``self.max_length`` is None for a model without
    attention layers, which keeps no cache and takes any length. ``state_dtype``: the recurrent states' dtype in the
    slots, None (default: the layers' own, fp32, or fp64 for an fp64 model) or ``torch.bfloat16`` (half the state
    memory and traffic of a decode step; each step still computes in fp32 and rounds the new state once:
    ``benchmarks/RESULTS.md`` measures how often its greedy tokens differ). Prefill always runs in full-precision
    states."""

    STATE_DTYPES = (None, torch.bfloat16)

    def __init__(self, model: LanguageModel, slots: int = 8, cuda_graph: bool | None = None,
                 prefill_tokens: int = 16384, max_length: int = DEFAULT_MAX_LENGTH,
                 state_dtype: torch.dtype | None = None):  # fmt: skip
        if not isinstance(slots, int) or slots < 1:
            raise UsageError(f"Engine: argument 'slots' must be an int >= 1, got {slots!r}")
        if not isinstance(prefill_tokens, int) or prefill_tokens < 1:
            raise UsageError(f"Engine: argument 'prefill_tokens' must be an int >= 1, got {prefill_tokens!r}")
        if not isinstance(max_length, int) or max_length < 1:
            raise UsageError(f"Engine: argument 'max_length' must be an int >= 1, got {max_length!r}")
        if state_dtype not in self.STATE_DTYPES:
            raise UsageError(f"Engine: argument 'state_dtype' must be None or torch.bfloat16, got "
                             f"{state_dtype!r}")  # fmt: skip
        self.state_dtype = state_dtype
        self.prefill_tokens = prefill_tokens
        self.model = model.eval()
        self.slots = slots
        self.device = next(model.parameters()).device
        self.cuda_graph = self.device.type == "cuda" if cuda_graph is None else cuda_graph
        if self.cuda_graph and self.device.type != "cuda":
            raise UsageError(f"Engine: argument 'cuda_graph' needs a CUDA model, got device {self.device}")
        self.vocab_size = model.config.vocab_size
        long = dict(dtype=torch.long, device=self.device)
        self.tokens = torch.zeros(slots, 1, **long)  # the step's input: each slot's last token
        self.positions = torch.zeros(slots, **long)
        self.counters = torch.zeros(slots, **long)  # new tokens so far, per slot: the noise counter
        self.seeds = torch.zeros(slots, **long)
        self.top_k = torch.zeros(slots, **long)
        self.temperature = torch.zeros(slots, device=self.device)
        self.top_p = torch.ones(slots, device=self.device)
        self.next_tokens = torch.zeros(slots, **long)  # the step's output
        # on CUDA the next step is queued before this one's tokens are read, so the host's work per step overlaps
        # the GPU's: each step's tokens go to one of two pinned host buffers in turn
        self._lookahead = 1 if self.device.type == "cuda" else 0
        self._host_tokens = [torch.zeros(slots, dtype=torch.long, pin_memory=self.device.type == "cuda")
                             for _ in range(2)]  # fmt: skip
        self._launched = 0
        with torch.no_grad():  # the state buffers: shapes and dtypes of a real step's, zeroed
            _, state = model(self.tokens, return_state=True)
        has_kv = any(layer.kv is not None for layer in state)
        self.max_length = max_length if has_kv else None  # None: no KV cache, any length
        self.states = [self._buffers(layer) for layer in state]
        self._graphs: dict[bool, torch.cuda.CUDAGraph] = {}  # by greedy: argmax only, or the full sampling
        self._captured_parameters = None  # the parameters' identity when the graphs were captured

    def _buffers(self, layer: MixerState) -> MixerState:
        """One layer's slot buffers, zeroed, from its state after one token per slot."""
        if layer.kv is not None:  # attention: [slots, H, 1, K] → [slots, H, max_length, K]
            kv = tuple(h.new_zeros(self.slots, h.shape[1], self.max_length, h.shape[3]) for h in layer.kv)
            return MixerState(kv=kv, position=self.positions, in_place=True)
        recurrent = torch.zeros_like(layer.recurrent, dtype=self.state_dtype or layer.recurrent.dtype)
        return MixerState(conv={k: torch.zeros_like(v) for k, v in layer.conv.items()}, recurrent=recurrent,
                          position=self.positions, in_place=True)  # fmt: skip

    def stream(self, prompts: Sequence[Tensor], sampling: Sampling | Sequence[Sampling] = DEFAULT_SAMPLING
               ) -> Iterator[tuple[int, int]]:  # fmt: skip
        """Runs every prompt (``[T]`` token ids; request i is prompts[i]) and yields ``(request id, token)`` as
        tokens are made. ``sampling``: one for all, or one per prompt."""
        return self._stream(self._requests(prompts, sampling))

    def generate(self, prompts: Sequence[Tensor], sampling: Sampling | Sequence[Sampling] = DEFAULT_SAMPLING
                 ) -> list[Request]:  # fmt: skip
        """Every prompt run to its end: the requests, with their new ``tokens`` and ``finish_reason``."""
        requests = self._requests(prompts, sampling)
        for _ in self._stream(requests):
            pass
        return requests

    def _parameters(self) -> tuple:
        return tuple((p.data_ptr(), p._version) for p in self.model.parameters())

    def _stream(self, requests: list[Request]) -> Iterator[tuple[int, int]]:
        if self._graphs and self._parameters() != self._captured_parameters:
            # the model changed since capture (an optimizer step, load_state_dict): the graphs would replay derived
            # tensors of the old weights (the projections' concatenated weight), so capture again
            self._graphs.clear()
        # active: slot -> request; in_flight: launched steps whose tokens are not read yet
        waiting, active, in_flight = deque(requests), {}, deque()
        while waiting or active:
            while waiting and len(active) < self.slots:  # a request that ends in its prefill leaves its slot free
                free = [slot for slot in range(self.slots) if slot not in active]
                batch, tokens = [], 0
                while waiting and len(batch) < len(free):
                    request = waiting[0]
                    if batch and tokens + len(request.prompt) > self.prefill_tokens:
                        break
                    waiting.popleft()
                    if request.sampling.max_new_tokens == 0:
                        request.finish_reason = "length"
                        continue
                    batch.append((free[len(batch)], request))
                    tokens += len(request.prompt)
                for slot, request, token in self._prefill(batch):
                    if token is not None:
                        yield request.id, token
                    if request.finish_reason is None:
                        active[slot] = request
            if not active:
                continue
            in_flight.append(self._launch_step(active))
            if len(in_flight) > self._lookahead:
                yield from self._collect(in_flight.popleft(), active)

    def _launch_step(self, active: dict[int, Request]) -> tuple[Tensor, torch.cuda.Event | None, dict[int, Request]]:
        """Queues one decoding step and the copy of its tokens to the host: (host tokens, the copy's event, the
        requests the step decodes)."""
        self._decode_step(greedy=all(r.sampling.temperature == 0 for r in active.values()))
        self._launched += 1
        host = self._host_tokens[self._launched % len(self._host_tokens)]
        host.copy_(self.next_tokens, non_blocking=self.device.type == "cuda")
        if self.device.type != "cuda":
            return host, None, dict(active)
        event = torch.cuda.Event()
        event.record()
        return host, event, dict(active)

    def _collect(self, launched: tuple[Tensor, torch.cuda.Event | None, dict[int, Request]],
                 active: dict[int, Request]) -> Iterator[tuple[int, int]]:  # fmt: skip
        """Waits for a launched step's tokens and gives them to the requests it decoded that are still going (a
        request that ended at the step before was decoded once more, its slot perhaps refilled since: ignored)."""
        host, event, decoded = launched
        if event is not None:
            event.synchronize()
        new_tokens = host.tolist()
        for slot, request in decoded.items():
            if request.finish_reason is not None:
                continue
            token = self._accept(request, new_tokens[slot])
            if token is not None:
                yield request.id, token
            if request.finish_reason is not None:
                del active[slot]

    def _requests(self, prompts, sampling) -> list[Request]:
        if isinstance(prompts, Tensor):
            raise UsageError("Engine: argument 'prompts' must be a sequence of [T] token tensors, got one tensor")
        settings = [sampling] * len(prompts) if isinstance(sampling, Sampling) else list(sampling)
        if len(settings) != len(prompts):
            raise UsageError(f"Engine: argument 'sampling' must be one Sampling or one per prompt "
                             f"({len(prompts)}), got {len(settings)}")  # fmt: skip
        requests = []
        for i, (prompt, setting) in enumerate(zip(prompts, settings, strict=True)):
            if not isinstance(prompt, Tensor) or prompt.dim() != 1:
                raise UsageError(f"Engine: prompt {i} must be a [T] token tensor, got "
                                 f"{type(prompt).__name__} {list(getattr(prompt, 'shape', []))}")  # fmt: skip
            if not isinstance(setting, Sampling):
                raise UsageError(f"Engine: sampling {i} must be a linrnn.inference.Sampling, got "
                                 f"{type(setting).__name__}")  # fmt: skip
            _check_prompt(prompt, self.vocab_size)
            if self.max_length is not None and len(prompt) + setting.max_new_tokens > self.max_length:
                raise UsageError(
                    f"Engine: request {i} needs len(prompt) + max_new_tokens = {len(prompt)} + "
                    f"{setting.max_new_tokens} = {len(prompt) + setting.max_new_tokens} KV-cache positions, more than "
                    f"argument 'max_length' = {self.max_length} (the attention layers' cache per slot); expected at "
                    f"most {self.max_length}: pass Engine(..., max_length={len(prompt) + setting.max_new_tokens}) or "
                    f"more"
                )
            requests.append(Request(i, prompt.to(self.device, torch.long), setting))
        return requests

    @torch.no_grad()
    def _prefill(self, batch: list[tuple[int, Request]]) -> list[tuple[int, Request, int | None]]:
        """Runs the prompts of ``batch`` ((slot, request) pairs) as packed documents in one forward, writes each
        one's state (attention: its keys and values, at positions 0 … len − 1) into its slot and samples its first
        token: (slot, request, token or None if it ended)."""
        if not batch:
            return []
        slots = torch.tensor([slot for slot, _ in batch], device=self.device)
        prompts = [request.prompt for _, request in batch]
        lengths = torch.tensor([len(prompt) for prompt in prompts], device=self.device)
        positions = torch.cat([torch.arange(len(prompt), device=self.device) for prompt in prompts])
        hidden, state = self.model.hidden_states(torch.cat(prompts)[None], None, True, positions[None])
        logits = self.model.readout(hidden[0, lengths.cumsum(0) - 1])  # each prompt's last position
        for buffer, layer in zip(self.states, state, strict=True):  # one row per prompt, into its slot
            if buffer.kv is not None:  # [D, H, L_max, K], zero past each prompt's length (masked in the steps)
                for cache, new in zip(buffer.kv, layer.kv, strict=True):
                    cache[:, :, : new.shape[2]].index_copy_(0, slots, new.to(cache.dtype))
                continue
            buffer.recurrent.index_copy_(0, slots, layer.recurrent.to(buffer.recurrent.dtype))
            for name, history in layer.conv.items():
                buffer.conv[name].index_copy_(0, slots, history.to(buffer.conv[name].dtype))
        self.positions[slots] = lengths
        self.counters[slots] = 0
        for column, values in ((self.seeds, [r.sampling.seed for _, r in batch]),
                               (self.temperature, [r.sampling.temperature for _, r in batch]),
                               (self.top_k, [r.sampling.top_k or 0 for _, r in batch]),
                               (self.top_p, [r.sampling.top_p or 1.0 for _, r in batch])):  # fmt: skip
            column[slots] = torch.tensor(values, dtype=column.dtype, device=self.device)
        per_slot = (self.temperature, self.top_k, self.top_p, self.seeds, self.counters)
        first = sample(logits, *(t[slots] for t in per_slot)).tolist()
        results = []
        for (slot, request), token in zip(batch, first, strict=True):
            token = self._accept(request, token)
            if request.finish_reason is None:
                self.tokens[slot, 0] = token
                self.counters[slot] = 1
            results.append((slot, request, token))
        return results

    @staticmethod
    def _accept(request: Request, token: int) -> int | None:
        """Records ``token`` for ``request``; None (and finished) for a stop token."""
        setting = request.sampling
        if token in setting.stop_tokens:
            request.finish_reason, request.stop_token = "stop", token
            return None
        request.tokens.append(token)
        if len(request.tokens) >= setting.max_new_tokens:
            request.finish_reason = "length"
        return token

    def _step(self, greedy: bool) -> None:
        """One token for every slot, in place: reads ``tokens`` and the state buffers, writes ``next_tokens`` and
        the state buffers (what the CUDA graph captures). ``greedy``: every active slot is, so argmax suffices."""
        logits, _ = self.model(self.tokens, state=self.states, return_state=True)  # updates self.states in place
        last = logits[:, -1]
        if greedy and use_triton(last, self.model.config.mixer.get("backend", "auto")) and last.stride(-1) == 1:
            from linrnn.kernels.triton.greedy import greedy_step

            greedy_step(last, self.next_tokens, self.tokens[:, 0], self.positions, self.counters)  # one launch
            return
        self.positions.add_(1)
        if greedy:
            self.next_tokens.copy_(last.argmax(dim=-1))
        else:
            self.next_tokens.copy_(sample(last, self.temperature, self.top_k, self.top_p, self.seeds, self.counters))
        self.tokens[:, 0].copy_(self.next_tokens)  # the next step's input; finished and idle slots are ignored
        self.counters.add_(1)

    @torch.no_grad()
    def _decode_step(self, greedy: bool) -> None:
        if not self.cuda_graph:
            self._step(greedy)
            return
        if greedy not in self._graphs:  # warm up on a side stream (kernels compile, allocator settles), then capture
            # KV caches need no undo: the warm-up writes each slot's entry at its position, which the step rewrites
            recurrences = [b for b in self.states if b.kv is None]
            saved = [(b.recurrent.clone(), {k: v.clone() for k, v in b.conv.items()}) for b in recurrences]
            position, tokens, counters = self.positions.clone(), self.tokens.clone(), self.counters.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step(greedy)
            torch.cuda.current_stream().wait_stream(side)
            for buffer, (recurrent, conv) in zip(recurrences, saved, strict=True):  # undo the warm-up step
                buffer.recurrent.copy_(recurrent)
                for name, history in conv.items():
                    buffer.conv[name].copy_(history)
            self.positions.copy_(position)
            self.tokens.copy_(tokens)
            self.counters.copy_(counters)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self._step(greedy)
            self._graphs[greedy] = graph
            self._captured_parameters = self._parameters()
        self._graphs[greedy].replay()


@torch.no_grad()
def generate(
    model: LanguageModel,
    prompt_ids: Tensor | Sequence[Tensor],
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
    *,
    top_p: float | None = None,
    stop_tokens: int | Sequence[int] = (),
    eos_token_id: int | Sequence[int] | None = None,
    seed: int | None = None,
) -> Tensor | list[Tensor]:
    """Up to ``max_new_tokens`` new tokens after each prompt, through an ``Engine`` with one slot per prompt (so
    the batch decodes together, one CUDA graph replay per token on CUDA).

    ``prompt_ids``: ``[T]`` → ``[T + max_new_tokens]``; ``[B, T]`` → ``[B, T + max_new_tokens]``; a list of ``[T_i]``
    tensors (lengths may differ) → a list of ``[T_i + n_i]`` tensors. Prompt then new tokens, int64, on the prompt's
    device; the model's train/eval mode is kept.

    Sampling: ``temperature`` 0 is greedy (argmax); else a draw from softmax(logits / temperature) among the
    ``top_k`` most likely tokens and the most likely tokens of mass ``top_p`` (``Engine``'s ``sample``).
    ``stop_tokens`` and ``eos_token_id`` (an id or several; both count) end a sequence at its first stop token. In
    a tensor result a sequence that stopped is filled with that stop token to the full width, so the first stop
    token after the prompt marks its end and the shape stays ``[B, T + max_new_tokens]``; in a list result each
    sequence ends at its last new token, without the stop token.

    Randomness: the draw for the n-th new token of prompt i is a function of (seed + i, n, token id) only
    (``uniform_noise``), so prompt i gets the tokens of ``Engine`` with ``Sampling(seed=seed + i)``, alone or in
    any batch. ``seed``: an int in [0, 2³¹). ``generator``: a ``torch.Generator`` to draw that seed from (one
    ``torch.randint`` on it: the generator advances, and the same seeded generator gives the same tokens). Neither:
    the seed is drawn from torch's global generator (``torch.manual_seed`` makes calls repeatable). Greedy
    decoding draws nothing. The distribution is that of the former token-by-token ``torch.multinomial`` loop, but
    not its random stream: a seeded generator gives other tokens than it did.

    Attention layers keep an ``Engine`` KV cache of the longest prompt + ``max_new_tokens`` positions per slot. The
    engine stays with the model for the next call of the same batch size (``_engine_for``)."""
    vocab = _check_model(model)
    if isinstance(prompt_ids, (list, tuple)):
        if not prompt_ids:
            raise UsageError("generate: argument 'prompt_ids' must hold at least one prompt, got an empty list")
        for i, prompt in enumerate(prompt_ids):
            if not isinstance(prompt, Tensor) or prompt.dim() != 1:
                raise UsageError(f"generate: argument 'prompt_ids[{i}]' must be an integer tensor [T] (a list holds "
                                 f"one 1-D tensor per prompt), got {describe(prompt)}")  # fmt: skip
            _check_prompt(prompt, vocab, f"prompt_ids[{i}]")
        prompts = list(prompt_ids)
    else:
        _check_prompt(prompt_ids, vocab)
        prompts = list(prompt_ids[None] if prompt_ids.dim() == 1 else prompt_ids)
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise UsageError(f"generate: argument 'max_new_tokens' must be an int >= 0, got {max_new_tokens!r}")
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise UsageError(f"generate: argument 'temperature' must be a number >= 0 (0: greedy), got {temperature!r}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1):
        raise UsageError(f"generate: argument 'top_k' must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):
        raise UsageError(f"generate: argument 'top_p' must be None or a number in (0, 1], got {top_p!r}")
    stops = _token_ids(stop_tokens, "stop_tokens", vocab) + _token_ids(eos_token_id, "eos_token_id", vocab)
    seed = _seed(seed, generator, draw=temperature > 0)
    if max_new_tokens == 0:
        requests = [Request(i, prompt, DEFAULT_SAMPLING) for i, prompt in enumerate(prompts)]
    else:
        settings = [Sampling(max_new_tokens=max_new_tokens, temperature=float(temperature), top_k=top_k,
                             top_p=None if top_p is None else float(top_p), stop_tokens=tuple(dict.fromkeys(stops)),
                             seed=(seed + i) % 2**31) for i in range(len(prompts))]  # fmt: skip
        was_training = model.training
        try:
            engine = _engine_for(model, len(prompts), max(map(len, prompts)) + max_new_tokens)
            requests = engine.generate(prompts, settings)
        finally:
            model.train(was_training)
    listed = isinstance(prompt_ids, (list, tuple))
    rows = []
    for prompt, request in zip(prompts, requests, strict=True):
        new = request.tokens
        if not listed and request.stop_token is not None:  # pad to the full width with the stop token
            new = new + [request.stop_token] * (max_new_tokens - len(new))
        rows.append(torch.cat([prompt.long(), torch.tensor(new, dtype=torch.long, device=prompt.device)]))
    if listed:
        return rows
    return rows[0] if prompt_ids.dim() == 1 else torch.stack(rows)


def _engine_for(model: LanguageModel, slots: int, length: int) -> Engine:
    """The engine ``generate`` runs: the one it made for this model at the last call when that has as many slots and
    room for ``length`` KV-cache positions (so a CUDA graph captured then is replayed, not captured again), else a
    new one, kept on the model for the next call (its slot buffers live as long as the model or the next call
    with another batch size)."""
    engine = model.__dict__.get("_generate_engine")
    if engine is None or engine.slots != slots or engine.max_length is not None and engine.max_length < length:
        engine = None  # the old one's buffers go before the new one's are made
        model.__dict__["_generate_engine"] = None
        engine = Engine(model, slots=slots, max_length=length)
        model.__dict__["_generate_engine"] = engine  # not an attribute nn.Module tracks: no state_dict entry
    return engine


def _check_model(model: object) -> int:
    """The model's vocabulary size; a ``UsageError`` for anything but a linrnn language model."""
    config = getattr(model, "config", None)
    if not isinstance(model, torch.nn.Module) or not isinstance(config, ModelConfig):
        raise UsageError(f"generate: argument 'model' must be a linrnn LanguageModel (linrnn.build_model, "
                         f"load_checkpoint, from_fla), got {type(model).__name__}")  # fmt: skip
    return config.vocab_size


def _is_real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def _token_ids(value: object, name: str, vocab_size: int) -> list[int]:
    """``value`` (None, a token id, or a sequence of them) as a list of ids in [0, vocab_size)."""
    if value is None:
        return []
    ids = [value] if isinstance(value, int) else value.tolist() if isinstance(value, Tensor) else value
    if isinstance(ids, int):  # a 0-d tensor
        ids = [ids]
    if not isinstance(ids, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise UsageError(f"generate: argument '{name}' must be a token id or a sequence of token ids, got "
                         f"{value!r}")  # fmt: skip
    for i in ids:
        if not 0 <= i < vocab_size:
            raise UsageError(f"generate: argument '{name}': expected token ids in [0, vocab_size = {vocab_size}), "
                             f"got {i}")  # fmt: skip
    return list(ids)


def _seed(seed: object, generator: object, draw: bool) -> int:
    """The seed of ``generate``: ``seed`` as given, else (when sampling) one drawn from ``generator`` or from torch's
    global generator."""
    if seed is not None and generator is not None:
        raise UsageError("generate: arguments 'seed' and 'generator' both give the randomness; expected one of them, "
                         "got both")  # fmt: skip
    if generator is not None and not isinstance(generator, torch.Generator):
        raise UsageError(f"generate: argument 'generator' must be None or a torch.Generator, got "
                         f"{type(generator).__name__}")  # fmt: skip
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
            raise UsageError(f"generate: argument 'seed' must be None or an int in [0, 2**31), got {seed!r}")
        return seed
    if not draw:
        return 0
    device = generator.device if generator is not None else "cpu"
    return int(torch.randint(0, 2**31, (1,), generator=generator, device=device))
