"""linrnn models in transformers: ``LinrnnConfig`` and ``LinrnnForCausalLM``, registered with ``AutoConfig`` and
``AutoModelForCausalLM`` (model_type "linrnn"), so that ``AutoModelForCausalLM.from_pretrained(folder)`` reads the
folders of ``LanguageModel.save_pretrained`` and ``linrnn export`` without ``trust_remote_code``.

``LinrnnForCausalLM`` wraps a ``LanguageModel`` (as ``.model``: the folder's weight names are "model." + its own).
Its forward takes ``input_ids``, ``labels`` (the next-token loss of transformers' causal LMs: shifted inside,
-100 ignored), ``attention_mask`` (padding on the right only, and none while a recurrent state is carried: a
recurrence cannot skip pad tokens; anything else is an error), ``position_ids`` (packed documents, each starting at
position 0: ``LanguageModel``'s ``positions``), ``cache`` and ``use_cache``. ``generate`` carries the recurrent state
(a ``LinrnnCache``: one ``MixerState`` per layer) from step to step, so each step feeds one token.

transformers is optional (``pip install linrnn[hf]``; tested with 4.57, 5.0 and 5.24). ``import linrnn`` does not
import it: it calls ``register_with_transformers``, which registers the classes at once if transformers is already
imported, else when it is first imported (a one-time import hook), so that linrnn's import stays light. The classes
are built on first use (``linrnn.models.hf.LinrnnForCausalLM`` builds them too).
"""

from __future__ import annotations

import importlib.abc
import sys
import warnings
from pathlib import Path
from typing import Any

from torch import Tensor

from linrnn.errors import UsageError
from linrnn.models.config import ModelConfig
from linrnn.models.lm import LanguageModel
from linrnn.recurrences.base import MixerState

MODEL_TYPE = "linrnn"
MIN_TRANSFORMERS = (4, 57)
CLASS_NAMES = ("LinrnnConfig", "LinrnnForCausalLM", "LinrnnCausalLMOutput")


class LinrnnCache:
    """The recurrent state ``LinrnnForCausalLM`` carries between calls: ``state``, one ``MixerState`` per layer
    (attention layers: their keys and values), after ``seen`` tokens. A forward that is given it reads it and
    advances it in place; ``generate`` keeps it in its ``cache``."""

    is_compileable = False  # what transformers' generate asks of a cache
    is_croppable = False

    def __init__(self):
        self.state: list[MixerState] | None = None
        self.seen = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen

    def advance(self, state: list[MixerState], tokens: int) -> None:
        self.state, self.seen = state, self.seen + tokens

    def reorder(self, rows: Tensor) -> None:
        """Keeps the batch rows ``rows`` (in that order): beam search's reordering."""
        if self.state is not None:
            self.state = [_rows(layer, rows) for layer in self.state]


def _rows(layer: MixerState, rows: Tensor) -> MixerState:
    def pick(tensor):
        return tensor.index_select(0, rows.to(tensor.device)) if isinstance(tensor, Tensor) else tensor

    kv = None if layer.kv is None else tuple(pick(tensor) for tensor in layer.kv)
    return MixerState(conv={name: pick(tensor) for name, tensor in layer.conv.items()}, recurrent=pick(layer.recurrent),
                      position=pick(layer.position), in_place=layer.in_place, kv=kv)  # fmt: skip


def register() -> bool:
    """Registers ``LinrnnConfig`` and ``LinrnnForCausalLM`` with transformers' ``AutoConfig`` and
    ``AutoModelForCausalLM`` (imports transformers). False, with a warning, if transformers is older than
    ``MIN_TRANSFORMERS``; False if it is not installed."""
    try:
        import transformers
    except ImportError:
        return False
    found = tuple(int(part) for part in transformers.__version__.split(".")[:2] if part.isdigit())
    if found < MIN_TRANSFORMERS:
        warnings.warn(f"linrnn: transformers {transformers.__version__} is older than "
                      f"{'.'.join(map(str, MIN_TRANSFORMERS))}; linrnn's models are not registered with its Auto "
                      f"classes", stacklevel=2)  # fmt: skip
        return False
    from transformers import AutoConfig, AutoModelForCausalLM

    classes = _classes()
    AutoConfig.register(MODEL_TYPE, classes["LinrnnConfig"], exist_ok=True)
    AutoModelForCausalLM.register(classes["LinrnnConfig"], classes["LinrnnForCausalLM"], exist_ok=True)
    return True


def register_with_transformers() -> None:
    """``register`` now if transformers is imported, else right after its first import (``import linrnn`` calls
    this: it imports nothing)."""
    if "transformers" in sys.modules:
        _register_quietly()
    elif not any(isinstance(finder, _RegisterOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegisterOnImport())


def _register_quietly() -> None:
    try:
        register()
    except Exception as error:  # never break the import of transformers
        warnings.warn(f"linrnn: could not register its models with transformers ({type(error).__name__}: {error})",
                      stacklevel=2)  # fmt: skip


class _RegisterOnImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: when ``module`` (transformers) is first looked for, it takes the spec the other finders
    give and makes its loader call ``register`` once the module has run; then it leaves ``sys.meta_path``."""

    def __init__(self, module: str = "transformers"):
        self.module = module

    def find_spec(self, name, path=None, target=None):
        if name != self.module:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None:
                break
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module):
            try:
                run(module)
            finally:
                vars(loader).pop("exec_module", None)
            _register_quietly()

        loader.exec_module = exec_module  # this spec's loader only
        return spec


def __getattr__(name: str):
    if name in CLASS_NAMES:
        return _classes()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _classes() -> dict[str, type]:
    """Defines the transformers classes on first use (importing transformers) and keeps them in this module."""
    if "LinrnnForCausalLM" in globals():
        return {name: globals()[name] for name in CLASS_NAMES}
    from dataclasses import dataclass

    from transformers import GenerationMixin, PreTrainedModel
    from transformers.utils import ModelOutput

    try:
        from transformers import PreTrainedConfig
    except ImportError:  # the older spelling
        from transformers import PretrainedConfig as PreTrainedConfig
    from transformers.generation import utils as generation_utils

    # generate's name for the cache among its model kwargs: "cache" in recent releases (5.24), "past_key_values" before
    cache_name = "cache" if "cache" in getattr(generation_utils, "ALL_CACHE_NAMES", ()) else "past_key_values"

    class LinrnnConfig(PreTrainedConfig):
        """config.json of a linrnn model: the whole ``ModelConfig`` as ``linrnn`` (a dict), the version that wrote
        it, and transformers' usual fields derived from it (vocab_size, hidden_size, num_hidden_layers,
        num_attention_heads, tie_word_embeddings; values given for them are replaced)."""

        model_type = MODEL_TYPE

        def __init__(self, linrnn: dict | ModelConfig | None = None, linrnn_version: str | None = None, **kwargs):
            if linrnn is None:  # transformers builds a default config to compare against
                config = ModelConfig(cell="gated_deltanet", vocab_size=256, hidden_size=64, num_layers=2, num_heads=2)
            elif isinstance(linrnn, ModelConfig):
                config = linrnn
            else:
                config = LanguageModel.config_from_hf({"linrnn": linrnn}, "LinrnnConfig: argument 'linrnn'")
            kwargs.update(LanguageModel.hf_config_fields(config))
            if linrnn_version is not None:
                kwargs["linrnn_version"] = linrnn_version
            kwargs.setdefault("use_cache", True)
            super().__init__(**kwargs)

        @property
        def model_config(self) -> ModelConfig:
            return ModelConfig(**self.linrnn)

        def to_diff_dict(self) -> dict[str, Any]:
            """transformers' saved config.json (only the values other than a default config's), always with the
            whole ModelConfig and the fields derived from it."""
            return {**super().to_diff_dict(), **LanguageModel.hf_config_fields(self.model_config),
                    "linrnn_version": self.linrnn_version}  # fmt: skip

    @dataclass
    class LinrnnCausalLMOutput(ModelOutput):
        """``loss`` (with ``labels``), ``logits`` ``[B, T, vocab]`` (the last ``logits_to_keep`` positions when
        given), and ``cache`` (with ``use_cache`` or a given cache)."""

        loss: Tensor | None = None
        logits: Tensor | None = None
        cache: LinrnnCache | None = None

    class LinrnnForCausalLM(PreTrainedModel, GenerationMixin):
        """A linrnn ``LanguageModel`` (``.model``) as a transformers causal LM; see the module's docstring."""

        config_class = LinrnnConfig
        base_model_prefix = "model"
        main_input_name = "input_ids"
        _no_split_modules = ["Block"]
        _is_stateful = True  # no assisted decoding: a recurrent state cannot be rolled back
        _tied_weights_keys = {"model.lm_head.weight": "model.embed.weight"}  # when config.tie_word_embeddings

        def __init__(self, config: LinrnnConfig):
            super().__init__(config)
            self.model = LanguageModel(config.model_config)
            self.post_init()

        def _init_weights(self, module) -> None:
            """Nothing: ``LanguageModel`` initialises itself when built, and ``from_pretrained`` requires every
            weight from the folder."""

        @classmethod
        def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
            """transformers' ``from_pretrained``, reading safetensors only; a local folder is first checked as
            ``LanguageModel.from_pretrained`` checks it (another model_type, or weights only as pickles, are refused
            unread), and every weight must be in it (nothing missing, nothing left over)."""
            caller = f"{cls.__name__}.from_pretrained"
            if kwargs.get("use_safetensors") is False:
                raise UsageError(f"{caller}: argument 'use_safetensors': linrnn reads safetensors only, got False")
            kwargs["use_safetensors"] = True
            folder = Path(str(pretrained_model_name_or_path)) / (kwargs.get("subfolder") or "")
            if folder.is_dir():
                LanguageModel.read_pretrained_folder(folder, caller)
            with_info = kwargs.pop("output_loading_info", False)
            model, info = super().from_pretrained(pretrained_model_name_or_path, *args, output_loading_info=True,
                                                  **kwargs)  # fmt: skip
            kinds = ("missing_keys", "unexpected_keys", "mismatched_keys")
            problems = [f"{kind.replace('_', ' ')} {sorted(info[kind])[:3]}" for kind in kinds if info.get(kind)]
            if problems:
                raise UsageError(f"{caller}: the weights of {pretrained_model_name_or_path} do not fit its config: "
                                 f"{'; '.join(problems)}")  # fmt: skip
            return (model, info) if with_info else model

        @classmethod
        def _supports_default_dynamic_cache(cls) -> bool:
            return False  # generate gets its cache from forward (a LinrnnCache), not a transformers Cache

        def get_input_embeddings(self):
            return self.model.embed

        def set_input_embeddings(self, value):
            self.model.embed = value

        def get_output_embeddings(self):
            return self.model.lm_head

        def set_output_embeddings(self, value):
            self.model.lm_head = value

        def forward(
            self,
            input_ids: Tensor | None = None,
            attention_mask: Tensor | None = None,
            position_ids: Tensor | None = None,
            labels: Tensor | None = None,
            cache: LinrnnCache | None = None,
            use_cache: bool | None = None,
            logits_to_keep: int | Tensor = 0,
            return_dict: bool | None = None,
            inputs_embeds: Tensor | None = None,
            past_key_values: LinrnnCache | None = None,
            **kwargs: Any,
        ):
            """Logits of ``input_ids`` ``[B, T]``; ``loss`` with ``labels``; the advanced ``cache`` with
            ``use_cache`` (default: only when a cache is given). See the module's docstring."""
            name = type(self).__name__
            loss_kwargs = {key: kwargs.pop(key) for key in ("num_items_in_batch", "ignore_index") if key in kwargs}
            unused = sorted(key for key, value in kwargs.items() if value is not None and value is not False)
            if unused or inputs_embeds is not None:
                raise ValueError(f"{name}.forward: unsupported arguments {unused or ['inputs_embeds']}; it takes "
                                 f"input_ids, attention_mask, position_ids, labels, cache, use_cache, "
                                 f"logits_to_keep")  # fmt: skip
            cache = cache if cache is not None else past_key_values
            if cache is not None and not isinstance(cache, LinrnnCache):
                raise ValueError(f"{name}.forward: argument 'cache': expected a LinrnnCache (the 'cache' of an "
                                 f"output with use_cache=True), got {type(cache).__name__}")  # fmt: skip
            stateful = bool(use_cache) or cache is not None
            if attention_mask is not None:
                _check_mask(attention_mask, input_ids, stateful, name)
            if position_ids is not None and stateful:
                raise ValueError(f"{name}.forward: argument 'position_ids' (packed documents) cannot be combined "
                                 f"with a carried state (cache, use_cache=True)")  # fmt: skip
            state = cache.state if cache is not None else None
            hidden, new_state = self.model.hidden_states(input_ids, state, stateful, position_ids)
            if stateful:
                cache = cache if cache is not None else LinrnnCache()
                cache.advance(new_state, input_ids.shape[1])
            if isinstance(logits_to_keep, int):
                hidden = hidden[:, -logits_to_keep:] if logits_to_keep > 0 else hidden
            else:
                hidden = hidden[:, logits_to_keep]
            logits = self.model.readout(hidden)
            loss = None
            if labels is not None:
                loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.model.config.vocab_size,
                                          **loss_kwargs)  # fmt: skip
            output = LinrnnCausalLMOutput(loss=loss, logits=logits, cache=cache if stateful else None)
            use_dict = return_dict if return_dict is not None else self.config.return_dict
            return output if use_dict else output.to_tuple()

        def prepare_inputs_for_generation(self, input_ids: Tensor, cache: LinrnnCache | None = None,
                                          attention_mask: Tensor | None = None, use_cache: bool = True,
                                          **kwargs: Any) -> dict[str, Any]:  # fmt: skip
            """The first step feeds the prompt; later ones only the tokens the carried state has not seen (one)."""
            cache = cache if cache is not None else kwargs.get("past_key_values")
            inputs: dict[str, Any] = {"cache": cache, "use_cache": use_cache}
            if cache is not None and cache.seen:
                input_ids, attention_mask = input_ids[:, cache.seen :], None  # the mask was checked on the prompt
            inputs["input_ids"] = input_ids.contiguous()
            # not position_ids: generate derives them from the mask, and the state carries the positions
            for key, value in (("attention_mask", attention_mask), ("logits_to_keep", kwargs.get("logits_to_keep")),
                               ("inputs_embeds", kwargs.get("inputs_embeds"))):  # fmt: skip
                if value is not None:
                    inputs[key] = value
            return inputs

        def _update_model_kwargs_for_generation(self, outputs, model_kwargs, *args, **kwargs):
            model_kwargs = super()._update_model_kwargs_for_generation(outputs, model_kwargs, *args, **kwargs)
            model_kwargs.pop("past_key_values", None)
            model_kwargs.pop("cache", None)
            if outputs.cache is not None:  # not with use_cache=False
                model_kwargs[cache_name] = outputs.cache  # where generate's beam search finds it
            return model_kwargs

        def _reorder_cache(self, cache: LinrnnCache | None, beam_idx: Tensor) -> LinrnnCache | None:
            if cache is not None:
                cache.reorder(beam_idx)
            return cache

    for cls in (LinrnnConfig, LinrnnCausalLMOutput, LinrnnForCausalLM):
        cls.__module__, cls.__qualname__ = __name__, cls.__name__  # pickled and shown as this module's
        globals()[cls.__name__] = cls
    return {name: globals()[name] for name in CLASS_NAMES}


def _check_mask(mask: Tensor, input_ids: Tensor, stateful: bool, name: str) -> None:
    """``attention_mask`` may pad on the right of a sequence without a carried state (the causal logits of the real
    tokens do not see the pads); any other padding is an error: a recurrence has no way to skip a token."""
    if not isinstance(mask, Tensor) or mask.dim() != 2 or mask.shape[0] != input_ids.shape[0]:
        got = list(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"{name}.forward: argument 'attention_mask': expected a tensor [batch = "
                         f"{input_ids.shape[0]}, tokens], got {got}")  # fmt: skip
    keep = mask != 0
    if bool(keep.all()):
        return
    if stateful:
        raise ValueError(f"{name}.forward: argument 'attention_mask' pads {int((~keep).sum())} positions, which a "
                         f"carried recurrent state (generate, use_cache=True) cannot skip; give prompts of one "
                         f"length (or one at a time), or use linrnn.generate, which takes prompts of different "
                         f"lengths")  # fmt: skip
    if mask.shape[1] != input_ids.shape[1] or not bool((keep[:, 1:] <= keep[:, :-1]).all()):
        raise ValueError(f"{name}.forward: argument 'attention_mask' pads on the left or inside a sequence, which a "
                         f"recurrence cannot skip; only padding on the right is taken (tokenizer padding_side="
                         f"'right')")  # fmt: skip


__all__ = ["LinrnnCache", "register", "register_with_transformers", *CLASS_NAMES]
