"""lm-eval-harness's model ``linrnn``: a ``linrnn train`` run folder or an FLA folder under lm-eval's tasks.

    python -m linrnn.evaluation.harness --model linrnn --model_args pretrained=RUN_FOLDER --tasks TASKS ...
    lm_eval --model linrnn --model_args pretrained=RUN_FOLDER --tasks TASKS ...

The first line is lm-eval's command line with the model registered first; it works with every lm-eval release.
The second needs an lm-eval that reads the ``lm_eval.models`` entry-point group (linrnn declares ``linrnn`` there):
lm-eval 0.4.13, the newest release, reads none, so there the model exists only once this module is imported
(the first line, or ``import linrnn.evaluation.harness`` before ``lm_eval.simple_evaluate(model="linrnn", ...)``).

``model_args``: ``pretrained`` (the folder, ``linrnn.evaluation.checkpoints``), ``device`` (default cuda when there
is one), ``dtype`` (float32, bfloat16 or float16; default float32), ``batch_size`` (rows per forward, and the
generation engine's slots; default 1), ``max_length`` (default none: the recurrent state carries any length; with
it, inputs keep their last ``max_length`` tokens and rolling loglikelihoods use lm-eval's windows of that many
tokens, each from a zero state, like a transformer's context), ``max_gen_toks`` (default 256).

Text becomes tokens as in ``linrnn train``: ``<s>`` then the text's tokens (``Tokens``). The requests:

- ``loglikelihood`` (context, continuation): the sum of the continuation tokens' log-probabilities after ``<s>`` and
  the context, and whether greedy decoding gives every one of them. The pair is split as lm-eval's ``TemplateLM``
  splits it (the context's trailing spaces join the continuation; the whole text is tokenized once). Batches of
  ``batch_size`` rows, longest first, padded on the right, which changes nothing before a row's last token.
- ``loglikelihood_rolling`` (text): the log-probability of all the text's tokens after ``<s>``, in one pass.
- ``generate_until`` (context, generation kwargs): through ``linrnn.Engine`` with ``batch_size`` slots (a model with
  attention layers: their KV cache per slot holds the longest prompt + ``max_gen_toks`` of the call), greedy
  unless ``do_sample`` (then ``temperature``, ``top_k``, ``top_p``, seed 0), ending at ``</s>`` or after
  ``max_gen_toks`` tokens; the text is then cut before the first of the ``until`` strings. The engine stops on
  tokens only, so a request runs on to its ``</s>`` or its token budget.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from linrnn.errors import UsageError, one_line
from linrnn.evaluation import checkpoints
from linrnn.evaluation.scoring import target_log_probs
from linrnn.inference import Engine, Sampling

NAME = "linrnn"
MODEL_ARGS = ("pretrained", "device", "dtype", "batch_size", "max_length", "max_gen_toks")
GENERATION_KWARGS = ("until", "max_gen_toks", "do_sample", "temperature", "top_k", "top_p")


class LinrnnLM(TemplateLM):
    """lm-eval's ``LM`` over a linrnn model (module docstring)."""

    def __init__(self, pretrained: str | None = None, device: str | None = None, dtype: str = "float32",
                 batch_size: int | str = 1, max_length: int | str | None = None, max_gen_toks: int | str = 256,
                 **unknown) -> None:  # fmt: skip
        super().__init__()
        if unknown:
            raise UsageError(f"model_args: expected only {', '.join(MODEL_ARGS)}, got {', '.join(unknown)}")
        if pretrained is None:
            raise UsageError("model_args pretrained: expected a linrnn run folder or an FLA folder, got none")
        self.batch_size = _positive_int(batch_size, "batch_size")
        self.max_length = None if max_length is None else _positive_int(max_length, "max_length")
        self.max_gen_toks = _positive_int(max_gen_toks, "max_gen_toks")
        self._device = checkpoints.parse_device(device, "model_args device")
        self.checkpoint = checkpoints.load(Path(str(pretrained)), "model_args pretrained", self._device,
                                           checkpoints.parse_dtype(str(dtype), "model_args dtype"))  # fmt: skip
        self.model = self.checkpoint.model
        self.tokens = self.checkpoint.tokens
        self._engine: Engine | None = None

    @property
    def eot_token_id(self) -> int:
        return self.tokens.eos if self.tokens.eos is not None else self.tokens.prefix

    @property
    def prefix_token_id(self) -> int:
        return self.tokens.prefix

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """The text's tokens after ``<s>`` (none with ``add_special_tokens=False``; one already there is kept)."""
        ids = self.tokens.encode(string)
        if add_special_tokens is False or ids[:1] == [self.prefix_token_id]:
            return ids
        return [self.prefix_token_id, *ids]

    def tok_decode(self, ids: list[int]) -> str:
        return self.tokens.decode(ids)

    def _loglikelihood_tokens(self, requests: list[tuple], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        """``requests``: (cache key or None, context tokens, continuation tokens) → (log-probability of the
        continuation, whether it is the greedy one), in order."""
        rows = [self._row(context, continuation) for _, context, continuation in requests]
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))  # longest first: little padding per batch
        answers: list[tuple[float, bool]] = [(0.0, True)] * len(rows)
        batches = [order[i : i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        for batch in tqdm(batches, desc="linrnn loglikelihood", disable=disable_tqdm):
            width = max(len(rows[i][0]) for i in batch)
            ids = torch.tensor([rows[i][0] + [self.prefix_token_id] * (width - len(rows[i][0])) for i in batch],
                               device=self._device)  # fmt: skip
            log_probs, greedy = target_log_probs(self.model, ids)  # [rows, width − 1]: position t predicts t + 1
            for row, i in enumerate(batch):
                tokens, predicted = rows[i]
                span = slice(len(tokens) - 1 - predicted, len(tokens) - 1)
                answers[i] = (float(log_probs[row, span].sum()), bool(greedy[row, span].all()))
                if requests[i][0] is not None:
                    self.cache_hook.add_partial("loglikelihood", requests[i][0], answers[i])
        return answers

    def _row(self, context: list[int], continuation: list[int]) -> tuple[list[int], int]:
        """The tokens of one row (the last ``max_length`` + 1 with a ``max_length``) and how many of its last
        tokens are scored."""
        tokens = context + continuation
        if self.max_length is not None and len(tokens) > self.max_length + 1:
            if len(continuation) > self.max_length:
                raise UsageError(f"model_args max_length: expected at least the longest continuation, "
                                 f"{len(continuation)} tokens, got {self.max_length}")  # fmt: skip
            tokens = tokens[-(self.max_length + 1) :]
        return tokens, len(continuation)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owners = [], []
        for index, (text,) in enumerate(request.args for request in requests):
            ids = self.tokens.encode(text)
            length = self.max_length or max(1, len(ids))  # without max_length: one window, the whole text
            for window in get_rolling_token_windows(ids, self.prefix_token_id, length, context_len=1):
                windows.append((None, *make_disjoint_window(window)))
                owners.append(index)
        totals = [0.0] * len(requests)
        for owner, (log_prob, _) in zip(owners, self._loglikelihood_tokens(windows, disable_tqdm), strict=True):
            totals[owner] += log_prob
        for request, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        prompts, settings, stop_strings = [], [], []
        for context, gen_kwargs in (request.args for request in requests):
            kwargs = dict(normalize_gen_kwargs(gen_kwargs, self.max_gen_toks))
            unknown = sorted(set(kwargs) - set(GENERATION_KWARGS))
            if unknown:
                raise UsageError(f"generation kwargs: expected only "
                                 f"{', '.join(GENERATION_KWARGS)}, got {', '.join(unknown)}")  # fmt: skip
            prompt = self.tok_encode(context)
            if self.max_length is not None:
                prompt = prompt[-self.max_length :]
            sampled = bool(kwargs["do_sample"])
            settings.append(Sampling(
                max_new_tokens=kwargs["max_gen_toks"],
                temperature=kwargs["temperature"] if sampled else 0.0,
                top_k=(kwargs.get("top_k") or None) if sampled else None,  # HF's top_k=0: no top-k
                top_p=kwargs.get("top_p") if sampled else None,
                stop_tokens=() if self.tokens.eos is None else (self.tokens.eos,),
            ))  # fmt: skip
            prompts.append(torch.tensor(prompt))
            stop_strings.append([text for text in kwargs["until"] if text])
        # attention layers keep a KV cache of max_length positions per slot: large enough for every request here
        # (a model without them has max_length None and takes any length)
        needed = max((len(prompt) + setting.max_new_tokens for prompt, setting in zip(prompts, settings, strict=True)),
                     default=1)  # fmt: skip
        if self._engine is None or (self._engine.max_length is not None and self._engine.max_length < needed):
            self._engine = Engine(self.model, slots=self.batch_size, max_length=needed)
        finished = self._engine.generate(prompts, settings)
        texts = []
        for request, done, until in zip(requests, finished, stop_strings, strict=True):
            text = self.tok_decode(done.tokens)
            for stop in until:
                text = text.split(stop, 1)[0]
            texts.append(text)
            self.cache_hook.add_partial("generate_until", request.args, text)
        return texts

    def get_model_info(self) -> dict:
        """What lm-eval records of the model in its results' config."""
        return {
            "model_num_parameters": self.model.num_parameters(),
            "model_dtype": str(next(self.model.parameters()).dtype),
            "linrnn_folder": str(self.checkpoint.folder),
            "linrnn_kind": self.checkpoint.kind,
            "linrnn_config": self.checkpoint.config,
        }


def _positive_int(value: int | str, name: str) -> int:
    """lm-eval gives model_args as numbers or as strings (``batch_size`` from its command line)."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if number < 1 or str(number) != str(value).strip():
        raise UsageError(f"model_args {name}: expected a positive integer, got {value!r}")
    return number


def register() -> None:
    """Registers ``LinrnnLM`` as lm-eval's model ``linrnn`` unless that name is taken (by this class through the
    entry point, or by an earlier import). lm-eval's own models are registered first: its ``get_model`` adds
    them only to an empty registry."""
    import lm_eval.models  # noqa: F401
    from lm_eval.api import registry

    if NAME not in registry.MODEL_REGISTRY:
        registry.register_model(NAME)(LinrnnLM)


register()


def main(argv: list[str] | None = None) -> int:
    """lm-eval's command line (``argv``, default ``sys.argv[1:]``) with the model ``linrnn`` registered; a bad
    ``model_args`` value or a task lm-eval does not know is one line on stderr and exit status 2."""
    from lm_eval.__main__ import cli_evaluate

    saved = sys.argv
    if argv is not None:
        sys.argv = [sys.argv[0], *argv]  # lm-eval's parser reads sys.argv itself
    try:
        cli_evaluate()
    except UsageError as error:
        print(f"python -m linrnn.evaluation.harness: {one_line(error)}", file=sys.stderr)
        return 2
    except ValueError as error:  # lm-eval's own refusals of its arguments, e.g. "Tasks not found: [...]"
        if not str(error).startswith("Tasks not found"):
            raise
        print(f"python -m linrnn.evaluation.harness: argument --tasks: {one_line(error)}", file=sys.stderr)
        return 2
    finally:
        sys.argv = saved
    return 0


if __name__ == "__main__":
    sys.exit(main())
