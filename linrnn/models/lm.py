"""The one generic language model: any registered cell as the token mixer."""

from __future__ import annotations

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
from linrnn.kernels.validation import describe
from linrnn.models.config import ModelConfig, model_config
from linrnn.recurrences.base import Documents, MixerState, ShortConv
from linrnn.recurrences.registry import build_mixer


class SwiGLU(nn.Module):
    """``down(SiLU(gate(x)) · up(x))``; ``backend`` as the mixers' (``linrnn.kernels.fused.swiglu``)."""

    def __init__(self, hidden_size: int, intermediate_size: int, backend: str = "auto"):
        super().__init__()
        self.backend = backend
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(swiglu(self.gate_proj(x), self.up_proj(x), self.backend))

    def local_param_roles(self) -> dict[str, str]:
        return {f"{name}.weight": "hidden" for name in ("gate_proj", "up_proj", "down_proj")}


class RMSNorm(nn.Module):
    """RMSNorm with a weight (``nn.RMSNorm``'s parameter); ``norm(x, delta)`` adds the residual ``delta`` first and
    returns (normalised, x + delta) — one fused kernel on CUDA (``linrnn.kernels.fused.rms_norm``)."""

    def __init__(self, hidden_size: int, eps: float, backend: str = "auto"):
        super().__init__()
        self.eps, self.backend = eps, backend
        self.weight = nn.Parameter(torch.ones(hidden_size))

    def forward(self, x: Tensor, delta: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        return rms_norm(x, self.weight, self.eps, delta, self.backend)


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
        mixed, state = self.mixer(self.mixer_norm(x), state, output_state, documents)
        normed, x = self.mlp_norm(x, mixed)  # x + mixed, and its norm
        return x + self.mlp(normed), state

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
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config, cell) for cell in config.layer_cells)
        self.norm = RMSNorm(config.hidden_size, config.norm_eps, config.mixer.get("backend", "auto"))
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
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
            documents = self._documents(input_ids, positions, state, return_state)
        x = self.embed(input_ids)
        if documents is not None:
            x = x.reshape(1, -1, x.shape[-1])  # [1, B·T, D]: rows fold into one packed sequence
        new_state = []
        recompute = self.config.checkpoint_activations and torch.is_grad_enabled() and not return_state
        for i, layer in enumerate(self.layers):
            if recompute:
                x, layer_state = checkpoint(layer, x, None, False, documents, use_reentrant=False)
            else:
                x, layer_state = layer(x, None if state is None else state[i], return_state, documents)
            new_state.append(layer_state)
        return self.norm(x).reshape(*input_ids.shape, -1), new_state

    @staticmethod
    def _documents(input_ids: Tensor, positions: Tensor, state, return_state: bool) -> Documents:
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
        return Documents.from_positions(positions)

    def num_parameters(self, exclude_embeddings: bool = False) -> int:
        total = sum(p.numel() for p in self.parameters())
        return total - self.embed.weight.numel() if exclude_embeddings else total


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


@torch.no_grad()
def generate(
    model: LanguageModel,
    prompt_ids: Tensor,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Sample ``max_new_tokens`` after ``prompt_ids`` (``[B, T]`` or ``[T]``) one token at a time with the
    carried recurrent state; temperature 0 is greedy. Returns prompt and new tokens, ``[B, T + new]``."""
    if not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise UsageError(f"generate: argument 'max_new_tokens' must be an int >= 0, got {max_new_tokens!r}")
    if temperature < 0:
        raise UsageError(f"generate: argument 'temperature' must be >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 1):
        raise UsageError(f"generate: argument 'top_k' must be None or an int >= 1, got {top_k!r}")
    _check_prompt(prompt_ids, model.config.vocab_size)
    squeeze = prompt_ids.dim() == 1
    tokens = prompt_ids[None] if squeeze else prompt_ids
    was_training = model.training
    model.eval()
    logits, state = model(tokens, return_state=True)
    for step in range(max_new_tokens):
        next_logits = logits[:, -1].float()
        if temperature == 0:
            next_token = next_logits.argmax(-1, keepdim=True)
        else:
            next_logits = next_logits / temperature
            if top_k is not None:
                threshold = next_logits.topk(min(top_k, next_logits.shape[-1]), dim=-1).values[:, -1:]
                next_logits = next_logits.masked_fill(next_logits < threshold, float("-inf"))
            next_token = torch.multinomial(next_logits.softmax(-1), 1, generator=generator)
        tokens = torch.cat([tokens, next_token], dim=1)
        if step + 1 < max_new_tokens:
            logits, state = model(next_token, state=state, return_state=True)
    model.train(was_training)
    return tokens[0] if squeeze else tokens


def _check_prompt(prompt_ids: Tensor, vocab_size: int) -> None:
    """An integer tensor [T] or [B, T] with at least one token per row, every id in [0, vocab_size)."""
    if not isinstance(prompt_ids, Tensor) or prompt_ids.dim() not in (1, 2) or prompt_ids.is_floating_point():
        raise UsageError(
            f"generate: argument 'prompt_ids' must be an integer tensor [T] or [B, T], got {describe(prompt_ids)}"
        )
    if prompt_ids.numel() == 0:
        raise UsageError(
            f"generate: argument 'prompt_ids' must hold at least one token, got shape {list(prompt_ids.shape)}"
        )
    low, high = int(prompt_ids.min()), int(prompt_ids.max())  # one device sync
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise UsageError(
            f"generate: argument 'prompt_ids': expected token ids in [0, vocab_size = {vocab_size}), got {bad}"
        )
