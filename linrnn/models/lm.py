"""The one generic language model: any registered cell as the token mixer."""

from __future__ import annotations

import json
import math
import textwrap
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from linrnn.errors import UsageError, one_line
from linrnn.kernels.fused import rms_norm, swiglu
from linrnn.kernels.linear import FusedInput, Linear, RMSNormed, SwiGLUed, fusing_inputs, linear
from linrnn.kernels.validation import describe
from linrnn.models.config import ModelConfig, model_config
from linrnn.models.folders import read_json, safetensors_files
from linrnn.recurrences.base import Documents, InferenceCache, MixerState, ShortConv
from linrnn.recurrences.registry import build_mixer


class SwiGLU(InferenceCache, nn.Module):
    """``down(SiLU(gate(x)) · up(x))``; ``backend`` as the mixers' (``linrnn.kernels.fused.swiglu``). Gate and up
    run as one GEMM over their weights concatenated (kept between calls without autograd), whose output the SwiGLU
    kernel reads in place and whose gradient its backward writes as one tensor (two GEMMs would sum two input
    gradients). Without autograd the down projection takes the SwiGLU product as a fused input
    (``linrnn.kernels.linear``); x may be one too. With hooks on gate or up (coordinate checks) they run as
    modules."""

    def __init__(self, hidden_size: int, intermediate_size: int, backend: str = "auto"):
        super().__init__()
        self.backend = backend
        self._inference_cache = {}
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = Linear(intermediate_size, hidden_size, bias=False, backend=backend)

    def forward(self, x: Tensor | FusedInput) -> Tensor:
        if has_hooks(self.gate_proj) or has_hooks(self.up_proj):
            x = x.compute() if isinstance(x, FusedInput) else x
            both = torch.cat([self.gate_proj(x), self.up_proj(x)], dim=-1)
        else:
            weights = [self.gate_proj.weight, self.up_proj.weight]
            weight = self._inference_cached("gate_up", weights, lambda: torch.cat(weights))
            both = linear(x, weight, None, self.backend)  # [..., 2 · intermediate]: gate, then up
        if fusing_inputs():
            return self.down_proj(SwiGLUed(both, self.backend))
        return self.down_proj(swiglu(both, self.backend))

    def local_param_roles(self) -> dict[str, str]:
        return {f"{name}.weight": "hidden" for name in ("gate_proj", "up_proj", "down_proj")}


def has_hooks(module: nn.Module) -> bool:
    """Whether calling ``module`` would run forward hooks (its own or global ones)."""
    from torch.nn.modules import module as module_globals

    return bool(module._forward_hooks or module._forward_pre_hooks or module_globals._global_forward_hooks
                or module_globals._global_forward_pre_hooks)  # fmt: skip


class RMSNorm(nn.Module):
    """RMSNorm with a weight (``nn.RMSNorm``'s parameter); ``norm(x, delta)`` adds the residual ``delta`` first and
    returns (normalised, x + delta) — one fused kernel on CUDA (``linrnn.kernels.fused.rms_norm``)."""

    def __init__(self, hidden_size: int, eps: float, backend: str = "auto"):
        super().__init__()
        self.eps, self.backend = eps, backend
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: Tensor, delta: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        return rms_norm(x, self.weight, self.eps, delta, self.backend)

    def fused_input(self, x: Tensor, delta: Tensor | None = None) -> RMSNormed:
        """``forward(x, delta)`` left to the next product's kernel (``linrnn.kernels.linear.RMSNormed``)."""
        return RMSNormed(x, self.weight, self.eps, delta, self.backend)


class Block(nn.Module):
    """Pre-norm residual block: x + mixer(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: ModelConfig, cell: str):
        super().__init__()
        backend = config.mixer.get("backend", "auto")
        self.mixer_norm = RMSNorm(config.hidden_size, config.norm_eps, backend)
        self.mixer = build_mixer(cell, config.hidden_size, config.num_heads, **config.mixer_options(cell))
        self.mlp_norm = RMSNorm(config.hidden_size, config.norm_eps, backend)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, backend)

    def forward(self, x: Tensor, state: MixerState | None, output_state: bool, documents: Documents | None = None):
        x, mlp_out, state = self.deferred(x, None, state, output_state, documents)
        return x + mlp_out, state

    def deferred(self, x: Tensor, pending: Tensor | None, state: MixerState | None, output_state: bool,
                 documents: Documents | None = None) -> tuple[Tensor, Tensor, MixerState | None]:  # fmt: skip
        """``forward`` with the residual adds left to the norms' kernels: ``pending`` (the previous block's MLP
        output, or None) is added to x by the first norm, and this block's MLP output is returned unadded, as
        (x + pending + mixer output, MLP output, state). Where the mixer takes fused inputs (the recurrent mixers)
        and ``fusing_inputs()``, each add + norm is left to the next product's kernel."""
        if fusing_inputs() and getattr(self.mixer, "takes_fused_input", False):
            normed = self.mixer_norm.fused_input(x, pending)
            mixed, state = self.mixer(normed, state, output_state, documents)
            normed = self.mlp_norm.fused_input(normed.total, mixed)
            mlp_out = self.mlp(normed)  # first: its product computes normed.total
            return normed.total, mlp_out, state
        if pending is None:
            normed = self.mixer_norm(x)
        else:
            normed, x = self.mixer_norm(x, pending)  # x + pending, and its norm
        mixed, state = self.mixer(normed, state, output_state, documents)
        normed, x = self.mlp_norm(x, mixed)  # x + mixed, and its norm
        return x, self.mlp(normed), state

    def local_param_roles(self) -> dict[str, str]:
        return {"mixer_norm.weight": "norm", "mlp_norm.weight": "norm"}


class LanguageModel(nn.Module):
    """``model(input_ids [B, T], state=None, return_state=False)`` → logits ``[B, T, vocab]`` (and the new state);
    ``model.loss(input_ids, targets)`` → the mean cross-entropy without forming the logits.

    ``state`` is a list with one ``MixerState`` per layer, as returned with ``return_state=True``;
    feeding tokens one at a time with the carried state gives the logits of the full forward.

    ``model(input_ids, positions=positions)`` (``[B, T]``, as torchtitan's packed loader gives them) treats each
    row as packed documents: wherever a position is 0 (and at each row start) the recurrent state and the
    short-conv history restart from zero, through the ops' varlen path on the rows folded into one sequence. With
    ``return_state=True`` each layer's state then has one row per document (in order): the state after it, from
    which that document's decoding goes on (``linrnn.Engine`` prefills several prompts this way).

    ``context_group`` (None, or a process group; set by the trainer): context parallelism. Each rank's rows are its
    slices of longer rows split along time over the group's ranks in rank order, and ``positions`` are the tokens'
    positions in their documents within the whole rows; recurrent states and short-conv inputs pass between the
    ranks (``linrnn.kernels.context_parallel``). Training forward passes only; recurrent layers only.
    """

    context_group = None  # a torch.distributed ProcessGroup under context parallelism

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, cell) for cell in config.layer_cells)
        self.norm = RMSNorm(config.hidden_size, config.norm_eps, config.mixer.get("backend", "auto"))
        self.lm_head = Linear(
            config.hidden_size, config.vocab_size, bias=False, backend=config.mixer.get("backend", "auto")
        )
        # outside lm_head so that logit_multiplier scales W h only: the bias's step moves the logits by the same
        # amount at every width
        self.logit_bias = nn.Parameter(torch.empty(config.vocab_size)) if config.readout_bias else None
        self.reset_parameters()
        if config.tie_embeddings:
            self.lm_head.weight = self.embed.weight

    def reset_parameters(self) -> None:
        """Matrices and embeddings ~ N(0, init_std²), biases 0; short convs by ``conv_init``; gate scalars, norms and
        Γ keep their own init."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.init_std)
            if isinstance(module, ShortConv):
                self.init_short_conv(module, self.config)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
        if self.logit_bias is not None:
            nn.init.zeros_(self.logit_bias)

    @staticmethod
    def init_short_conv(conv: ShortConv, config: ModelConfig) -> None:
        if config.conv_init == "normal":
            nn.init.normal_(conv.weight, std=config.init_std)
        else:
            nn.init.kaiming_uniform_(conv.weight, a=math.sqrt(5))  # U(±1/√fan_in): Conv1d's default

    def local_param_roles(self) -> dict[str, str]:
        roles = {"embed.weight": "embedding", "norm.weight": "norm", "lm_head.weight": "readout"}
        return roles | ({"logit_bias": "bias"} if self.logit_bias is not None else {})

    def forward(
        self,
        input_ids: Tensor,
        state: list[MixerState] | None = None,
        return_state: bool = False,
        positions: Tensor | None = None,
    ):
        hidden, new_state = self.hidden_states(input_ids, state, return_state, positions)
        logits = self.readout(hidden)
        return (logits, new_state) if return_state else logits

    def readout(self, hidden: Tensor) -> Tensor:
        """Logits ``[..., vocab]`` from final-norm outputs ``[..., hidden]`` (``hidden_states``)."""
        logits = self.lm_head(hidden)
        if self.config.logit_multiplier != 1:
            logits = logits * self.config.logit_multiplier
        if self.logit_bias is not None:
            logits = logits + self.logit_bias
        return logits

    def loss(self, input_ids: Tensor, targets: Tensor, positions: Tensor | None = None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:  # fmt: skip
        """Next-token cross-entropy of ``input_ids`` ``[B, T]`` against ``targets`` ``[B, T]`` (tokens equal to
        ``ignore_index`` left out; ``reduction`` "mean" or "sum"), equal to ``cross_entropy(model(input_ids),
        targets)`` without forming the ``[B, T, vocab]`` logits (``linrnn.kernels.cross_entropy``)."""
        from linrnn.kernels.cross_entropy import linear_cross_entropy

        if not isinstance(targets, Tensor) or targets.shape != input_ids.shape or targets.is_floating_point():
            raise ValueError(
                f"LanguageModel.loss: argument 'targets' must be an integer tensor of input_ids' shape "
                f"{list(input_ids.shape)}, got {describe(targets)}"
            )
        hidden, _ = self.hidden_states(input_ids, None, False, positions)
        return linear_cross_entropy(hidden, self.lm_head.weight, targets, bias=self.logit_bias,
                                    multiplier=self.config.logit_multiplier, ignore_index=ignore_index,
                                    reduction=reduction, backend=self.config.mixer.get("backend", "auto"))  # fmt: skip

    def hidden_states(self, input_ids: Tensor, state: list[MixerState] | None = None, return_state: bool = False,
                      positions: Tensor | None = None) -> tuple[Tensor, list[MixerState | None]]:  # fmt: skip
        """The final norm's output ``[B, T, hidden]`` (what ``lm_head`` reads) and the new state per layer."""
        if not isinstance(input_ids, Tensor) or input_ids.dim() != 2 or input_ids.is_floating_point():
            raise ValueError(
                f"LanguageModel: argument 'input_ids' must be an integer tensor [B, T], got {describe(input_ids)}"
            )
        if state is not None and len(state) != len(self.layers):
            raise ValueError(
                f"LanguageModel: argument 'state' must hold {len(self.layers)} layer states, got {len(state)}"
            )
        documents = None
        if positions is not None:
            documents = self._documents(input_ids, positions, state, return_state, self.context_group)
        elif self.context_group is not None:
            raise ValueError("LanguageModel: context parallelism needs 'positions' (each token's position in its "
                             "document within the whole row), got None")  # fmt: skip
        x = self.embed(input_ids)
        if documents is not None:
            x = x.reshape(1, -1, x.shape[-1])  # [1, B·T, D]: rows fold into one packed sequence
        new_state = []
        recompute = self.config.checkpoint_activations and torch.is_grad_enabled() and not return_state
        # each block's last residual add goes into the next norm's kernel (Block.deferred), eager training
        # included; a block runs whole under torch.compile (inductor in torch 2.11 spent minutes printing ever
        # deeper IR expressions of the 21-layer graph so deferred, not finishing in 6), with hooks (coordinate
        # checks, FSDP) or compiled in place (torchtitan): those wrap its forward
        defer = not torch.compiler.is_compiling()
        pending = None  # the previous block's MLP output, not yet added to x
        for i, layer in enumerate(self.layers):
            layer_state_in = None if state is None else state[i]
            whole = has_hooks(layer) or layer._compiled_call_impl is not None
            if defer and not whole:
                if recompute:
                    x, pending, layer_state = checkpoint(layer.deferred, x, pending, None, False, documents,
                                                         use_reentrant=False)  # fmt: skip
                else:
                    x, pending, layer_state = layer.deferred(x, pending, layer_state_in, return_state, documents)
                new_state.append(layer_state)
                continue
            if pending is not None:
                x, pending = x + pending, None
            if recompute:
                x, layer_state = checkpoint(layer, x, None, False, documents, use_reentrant=False)
            else:
                x, layer_state = layer(x, layer_state_in, return_state, documents)
            new_state.append(layer_state)
        normed = self.norm(x) if pending is None else self.norm(x, pending)[0]
        return normed.reshape(*input_ids.shape, -1), new_state

    @staticmethod
    def _documents(input_ids: Tensor, positions: Tensor, state, return_state: bool, context_group=None) -> Documents:
        if not isinstance(positions, Tensor) or positions.shape != input_ids.shape or positions.is_floating_point():
            raise ValueError(
                f"LanguageModel: argument 'positions' must be an integer tensor of input_ids' shape "
                f"{list(input_ids.shape)}, got {describe(positions)}"
            )
        if state is not None:
            raise ValueError(
                "LanguageModel: packed documents ('positions') start from a zero state; 'state' (carried decoding "
                "state) cannot be combined with them"
            )
        return Documents.from_positions(positions, context_group)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())
        return total - self.embed.weight.numel() if exclude_embeddings else total

    # Hugging Face folders. config.json: model_type "linrnn", the whole ModelConfig under "linrnn", the linrnn version
    # and transformers' usual fields (derived); model.safetensors: the weights under LinrnnForCausalLM's names
    # ("model." + this module's), the readout left out when tied; the tokenizer's files when saved with one.
    # linrnn.models.hf registers the transformers classes that read and write the same folders.

    TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")

    def save_pretrained(self, folder: str | Path, tokenizer: Any = None) -> Path:
        """Writes the Hugging Face folder ``folder`` (created if need be; its config.json and model.safetensors
        replaced): ``LanguageModel.from_pretrained`` and ``transformers.AutoModelForCausalLM.from_pretrained`` (after
        ``import linrnn``) read it. ``tokenizer``: a folder with tokenizer.json (a ``linrnn train`` run's
        ``tokenizer/``), a ``tokenizers.Tokenizer`` or a transformers tokenizer; its files are written beside the
        weights and its BOS/EOS ids into config.json. Needs no transformers. Returns the folder."""
        from safetensors.torch import save_file

        folder = Path(folder)
        if folder.exists() and not folder.is_dir():
            raise UsageError(f"save_pretrained: argument 'folder': expected a folder, got the file {folder}")
        files, special = self._tokenizer_files(tokenizer) if tokenizer is not None else ({}, {})
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in files.items():
            (folder / name).write_text(text)
        save_file(self.hf_state_dict(), str(folder / "model.safetensors"), metadata={"format": "pt"})
        config = self.hf_config(self.config, str(self.embed.weight.dtype).removeprefix("torch."), **special)
        (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | Path) -> LanguageModel:
        """The model of a folder written by ``save_pretrained`` (or ``LinrnnForCausalLM.save_pretrained``, or
        ``linrnn export``), in fp32 on the CPU. Only safetensors are read: a folder whose weights are pickles
        (pytorch_model.bin, .pt, ...) is refused unread, as is one whose config.json has another model_type; each
        error is a ``UsageError`` (a ``ValueError``) on one line."""
        from safetensors.torch import load_file

        config_json, weight_files = cls.read_pretrained_folder(folder, "LanguageModel.from_pretrained")
        model = cls(cls.config_from_hf(config_json, Path(folder) / "config.json"))
        weights = {}
        for file in weight_files:
            weights.update(load_file(str(file)))
        model.load_hf_state_dict(weights, f"{folder}'s weights")
        return model

    def hf_state_dict(self) -> dict[str, Tensor]:
        """The weights under the Hugging Face folder's names: ``"model." + name``, without the readout when it is the
        embedding (``tie_embeddings``)."""
        return {f"model.{name}": tensor.detach().contiguous() for name, tensor in self.state_dict().items()
                if not (self.config.tie_embeddings and name == "lm_head.weight")}  # fmt: skip

    def load_hf_state_dict(self, weights: dict[str, Tensor], source: str) -> None:
        """Loads ``hf_state_dict``'s names and tensors (all of them, nothing else); a ``UsageError`` naming
        ``source`` otherwise."""
        native = {name.removeprefix("model."): tensor for name, tensor in weights.items() if name.startswith("model.")}
        foreign = sorted(name for name in weights if not name.startswith("model."))
        if self.config.tie_embeddings:  # one weight stored, under either name (older transformers keep the readout)
            for name, other in (("lm_head.weight", "embed.weight"), ("embed.weight", "lm_head.weight")):
                if other in native:
                    native.setdefault(name, native[other])
        try:
            if foreign:
                raise RuntimeError(f"unexpected names {foreign[:3]} (every name starts with 'model.')")
            self.load_state_dict(native)
        except RuntimeError as error:
            raise UsageError(f"{source} do not fit its config ({_reason(error)})") from error

    @classmethod
    def hf_config(cls, config: ModelConfig, dtype: str = "float32", **special_token_ids: int) -> dict[str, Any]:
        """The folder's config.json for a model of ``config`` stored in ``dtype``: ``hf_config_fields`` and
        transformers' class and settings (``bos_token_id=``, ... from the tokenizer)."""
        return {"model_type": "linrnn", "architectures": ["LinrnnForCausalLM"], **cls.hf_config_fields(config),
                "dtype": dtype, "use_cache": True, **special_token_ids}  # fmt: skip

    @staticmethod
    def hf_config_fields(config: ModelConfig) -> dict[str, Any]:
        """What config.json holds of the model: the whole ``config`` ("linrnn"), the linrnn version, and the fields
        transformers' tools read, derived from it."""
        from importlib.metadata import PackageNotFoundError, version

        try:
            linrnn_version = version("linrnn")
        except PackageNotFoundError:
            linrnn_version = "unknown"
        return {
            "linrnn": config.model_dump(mode="json"),
            "linrnn_version": linrnn_version,
            "vocab_size": config.vocab_size,
            "hidden_size": config.hidden_size,
            "intermediate_size": config.intermediate_size,
            "num_hidden_layers": config.num_layers,
            "num_attention_heads": config.num_heads,
            "tie_word_embeddings": config.tie_embeddings,
        }

    @staticmethod
    def config_from_hf(config_json: dict, file: str | Path) -> ModelConfig:
        """The ``ModelConfig`` under config.json's "linrnn"; a ``UsageError`` naming ``file`` if it is not one."""
        values = config_json.get("linrnn")
        if not isinstance(values, dict):
            raise UsageError(f"{file}: expected the model's ModelConfig under 'linrnn', got {type(values).__name__}")
        try:
            return ModelConfig(**values)
        except (TypeError, ValueError) as error:
            raise UsageError(f"{file}: its 'linrnn' is not a valid ModelConfig ({one_line(error)})") from error

    @staticmethod
    def read_pretrained_folder(folder: str | Path, caller: str) -> tuple[dict, list[Path]]:
        """config.json of a linrnn Hugging Face folder and its safetensors files, checked before any weight is read:
        a ``UsageError`` starting with ``caller`` for a missing folder or config.json, another model_type, or weights
        only as pickles (named, never opened)."""
        folder = Path(folder)
        expected = "a folder written by save_pretrained (config.json, model.safetensors)"
        if not folder.is_dir():
            raise UsageError(f"{caller}: argument 'folder': expected {expected}, got {folder} "
                             f"({'a file' if folder.exists() else 'no such folder'})")  # fmt: skip
        config_file = folder / "config.json"
        if not config_file.is_file():
            raise UsageError(
                f"{caller}: argument 'folder': expected {expected}, got {folder}, which has no config.json"
            )
        config_json = read_json(config_file, f"{caller}: {folder}")
        model_type = config_json.get("model_type") if isinstance(config_json, dict) else None
        if model_type != "linrnn":
            fla = " (an FLA Gated DeltaNet folder: linrnn.from_fla reads it)" if model_type == "gated_deltanet" else ""
            raise UsageError(f"{caller}: {config_file}: expected model_type 'linrnn', got {model_type!r}{fla}")
        return config_json, safetensors_files(folder, f"{caller}: {folder}")

    def _tokenizer_files(self, tokenizer: Any) -> tuple[dict[str, str], dict[str, int]]:
        """The tokenizer's files for the folder (tokenizer.json; tokenizer_config.json naming the class transformers'
        AutoTokenizer builds, and the special tokens) and the special-token ids for config.json."""
        import tempfile

        text: dict[str, str] = {}
        expected = "a folder with tokenizer.json, a tokenizers.Tokenizer or a transformers tokenizer"
        if isinstance(tokenizer, (str, Path)):
            source = Path(tokenizer)
            if not (source / "tokenizer.json").is_file():
                raise UsageError(f"save_pretrained: argument 'tokenizer': expected {expected}, got {source}, which "
                                 f"has no tokenizer.json")  # fmt: skip
            text = {name: (source / name).read_text() for name in self.TOKENIZER_FILES if (source / name).is_file()}
        elif hasattr(tokenizer, "save_pretrained"):  # a transformers tokenizer
            with tempfile.TemporaryDirectory() as scratch:
                tokenizer.save_pretrained(scratch)
                text = {name: (Path(scratch) / name).read_text() for name in self.TOKENIZER_FILES
                        if (Path(scratch) / name).is_file()}  # fmt: skip
            if "tokenizer.json" not in text:
                raise UsageError(f"save_pretrained: argument 'tokenizer': expected {expected}, got a "
                                 f"{type(tokenizer).__name__}, which writes no tokenizer.json")  # fmt: skip
        elif hasattr(tokenizer, "to_str") and hasattr(tokenizer, "token_to_id"):  # tokenizers.Tokenizer
            text = {"tokenizer.json": tokenizer.to_str()}
        else:
            raise UsageError(f"save_pretrained: argument 'tokenizer': expected {expected}, got "
                             f"{type(tokenizer).__name__}")  # fmt: skip
        from tokenizers import Tokenizer

        try:
            parsed = Tokenizer.from_str(text["tokenizer.json"])
            settings = json.loads(text.get("tokenizer_config.json", "{}"))
        except Exception as error:  # tokenizers raises plain Exceptions
            raise UsageError(f"save_pretrained: argument 'tokenizer': its tokenizer.json or tokenizer_config.json "
                             f"cannot be read ({one_line(error)})") from error  # fmt: skip
        size = parsed.get_vocab_size(with_added_tokens=True)
        if size > self.config.vocab_size:
            raise UsageError(f"save_pretrained: argument 'tokenizer': expected at most the model's vocab_size = "
                             f"{self.config.vocab_size} tokens, got {size}")  # fmt: skip
        special = {}
        for key, default in (("bos_token", "<s>"), ("eos_token", "</s>"), ("pad_token", None)):  # linrnn train's
            name = settings.get(key, default)
            name = name.get("content") if isinstance(name, dict) else name  # transformers' AddedToken form
            token = parsed.token_to_id(name) if isinstance(name, str) else None
            if token is not None:
                settings.setdefault(key, name)
                special[f"{key}_id"] = token
        settings.setdefault("tokenizer_class", "PreTrainedTokenizerFast")
        settings.setdefault("model_input_names", ["input_ids", "attention_mask"])  # no token_type_ids
        text["tokenizer_config.json"] = json.dumps(settings, indent=2) + "\n"
        return text, special


def save_checkpoint(model: LanguageModel, path: str | Path) -> None:
    """One file with the model's config and weights (``load_checkpoint`` reads it back)."""
    torch.save({"config": model.config.model_dump(), "model": model.state_dict()}, path)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> LanguageModel:
    """A model saved by ``save_checkpoint``. Any other file raises ``UsageError`` (a ``ValueError``) saying why;
    nothing in it is unpickled beyond tensors and plain containers (``weights_only=True``)."""

    def not_ours(why: str) -> UsageError:
        return UsageError(f"load_checkpoint: {path} is not a linrnn checkpoint: {why}")

    with open(path, "rb") as file:  # a missing file raises FileNotFoundError, as torch.load would
        if not zipfile.is_zipfile(file):
            raise not_ours("expected a zip archive written by torch.save, got other bytes")
    try:
        saved = torch.load(path, map_location=map_location, weights_only=True)
    except OSError:
        raise  # no permission, ...: not about the contents
    except Exception as error:  # pickle, zip, struct, ... errors: which one depends on the bytes
        raise not_ours(f"torch.load cannot read it ({_reason(error)})") from error
    if not isinstance(saved, dict) or set(saved) != {"config", "model"}:
        got = f"keys {sorted(map(str, saved))}" if isinstance(saved, dict) else f"a {type(saved).__name__}"
        raise not_ours(f"expected a dict with keys ['config', 'model'], got {got}")
    try:
        model = LanguageModel(ModelConfig(**saved["config"]))
    except (TypeError, ValueError) as error:
        raise not_ours(f"its config is invalid ({_reason(error)})") from error
    try:
        model.load_state_dict(saved["model"])
    except (TypeError, RuntimeError) as error:
        raise not_ours(f"its weights do not fit its config ({_reason(error)})") from error
    return model


def _reason(error: Exception) -> str:
    """The gist of an error, on one line: the weights-only unpickler's reason, else the message, shortened."""
    text = one_line(error).split("WeightsUnpickler error:")[-1].split(" Check the documentation of torch.load")[0]
    return textwrap.shorten(f"{type(error).__name__}: {text}", 240, placeholder=" …")


def build_model(cell: str, preset: str = "byte-tiny", **overrides: Any) -> LanguageModel:
    """``build_model("gdn", preset="byte-tiny", num_layers=3, expand_v=2.0)``: preset values, then overrides
    (ModelConfig fields, or mixer options such as ``use_rope``, ``backend``, ``chunk_size``)."""
    return LanguageModel(model_config(cell, preset, **overrides))


def _check_prompt(prompt_ids: Tensor, vocab_size: int, name: str = "prompt_ids") -> None:
    """An integer tensor [T] or [B, T] with at least one token per row, every id in [0, vocab_size); errors name
    the argument ``name`` of ``linrnn.generate`` (which, like ``linrnn.Engine``, calls this)."""
    if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() not in (1, 2) or prompt_ids.is_floating_point():
        raise UsageError(
            f"generate: argument '{name}' must be an integer tensor [T] or [B, T], got {describe(prompt_ids)}"
        )
    if prompt_ids.numel() == 0:
        raise UsageError(
            f"generate: argument '{name}' must hold at least one token, got shape {list(prompt_ids.shape)}"
        )
    low, high = int(prompt_ids.min()), int(prompt_ids.max())  # one device sync
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise UsageError(
            f"generate: argument '{name}': expected token ids in [0, vocab_size = {vocab_size}), got {bad}"
        )
