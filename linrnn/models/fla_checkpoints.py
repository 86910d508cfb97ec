"""Gated DeltaNet checkpoints of flash-linear-attention (FLA) in and out of linrnn's model.

FLA's ``GatedDeltaNetForCausalLM`` (``model_type`` "gated_deltanet") is linrnn's generic model with the
``gated_deltanet`` cell, parameter for parameter: the same projections (FLA's ``a_proj`` is linrnn's decay
projection ``f_proj``), short convs, ``A_log``/``dt_bias`` gate, gated output norm, SwiGLU blocks and readout.
``from_fla`` renames the tensors and builds the model from FLA's config; ``to_fla`` writes a folder that
``GatedDeltaNetForCausalLM.from_pretrained`` reads. FLA variants without a linrnn counterpart are refused with the
config field that differs: hybrid attention layers (``attn``), grouped value heads (``num_v_heads``), no output
gate, a sigmoid output gate, attention residuals, conv biases.

Weights are read from ``*.safetensors`` only (one file or an index of shards): linrnn does not unpickle files it did
not write, so a ``pytorch_model.bin`` is refused with that reason. Parameters load into fp32, as linrnn's models
train (bf16 autocast); ``model.to(torch.bfloat16)`` afterwards for bf16 inference.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from torch import Tensor, nn

from linrnn.errors import UsageError, one_line
from linrnn.models.config import ModelConfig
from linrnn.models.lm import LanguageModel

FLA_MODEL_TYPE = "gated_deltanet"
# linrnn parameter name → FLA's, for each layer (the rest of the model: _GLOBAL_NAMES)
_LAYER_NAMES = {
    "mixer_norm.weight": "attn_norm.weight",
    "mixer.q_proj.weight": "attn.q_proj.weight",
    "mixer.k_proj.weight": "attn.k_proj.weight",
    "mixer.v_proj.weight": "attn.v_proj.weight",
    "mixer.f_proj.weight": "attn.a_proj.weight",
    "mixer.b_proj.weight": "attn.b_proj.weight",
    "mixer.A_log": "attn.A_log",
    "mixer.dt_bias": "attn.dt_bias",
    "mixer.q_conv.weight": "attn.q_conv1d.weight",
    "mixer.k_conv.weight": "attn.k_conv1d.weight",
    "mixer.v_conv.weight": "attn.v_conv1d.weight",
    "mixer.g_proj.weight": "attn.g_proj.weight",
    "mixer.o_norm.weight": "attn.o_norm.weight",
    "mixer.o_proj.weight": "attn.o_proj.weight",
    "mlp_norm.weight": "mlp_norm.weight",
    "mlp.gate_proj.weight": "mlp.gate_proj.weight",
    "mlp.up_proj.weight": "mlp.up_proj.weight",
    "mlp.down_proj.weight": "mlp.down_proj.weight",
}
_GLOBAL_NAMES = {"embed.weight": "model.embeddings.weight", "norm.weight": "model.norm.weight",
                 "lm_head.weight": "lm_head.weight"}  # fmt: skip
# FLA config fields linrnn's model has no counterpart for: {field: (FLA's default, the values linrnn can take)}
_REQUIRED = {
    "attn": (None, (None,)),  # hybrid attention layers
    "num_v_heads": (None, (None,)),  # grouped value heads (equal to num_heads is fine too)
    "use_gate": (True, (True,)),
    "output_gate_activation": ("swish", ("swish", "silu")),
    "hidden_act": ("swish", ("swish", "silu")),
    "use_short_conv": (True, (True,)),
    "attnres_block_size": (None, (None,)),
}


def fla_name(linrnn_name: str) -> str:
    """FLA's name of a linrnn parameter: ``layers.3.mixer.f_proj.weight`` → ``model.layers.3.attn.a_proj.weight``."""
    if linrnn_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[linrnn_name]
    match = re.fullmatch(r"layers\.(\d+)\.(.+)", linrnn_name)
    if match is None or match[2] not in _LAYER_NAMES:
        raise KeyError(f"no FLA name for linrnn parameter {linrnn_name!r}")
    return f"model.layers.{match[1]}.{_LAYER_NAMES[match[2]]}"


def config_from_fla(fla_config: dict[str, Any], intermediate_size: int | None = None, backend: str = "auto"
                    ) -> ModelConfig:  # fmt: skip
    """linrnn's ``ModelConfig`` of an FLA Gated DeltaNet config (``config.json``'s dict). ``intermediate_size``:
    the SwiGLU width read from the weights (FLA's config may leave it None and derive it)."""
    where = "FLA config"
    if fla_config.get("model_type") != FLA_MODEL_TYPE:
        raise UsageError(
            f"{where}: expected model_type {FLA_MODEL_TYPE!r} (FLA's Gated DeltaNet), "
            f"got {fla_config.get('model_type')!r}"
        )
    for field, (default, allowed) in _REQUIRED.items():
        value = fla_config.get(field, default)
        if field == "num_v_heads" and value == fla_config.get("num_heads"):
            continue
        if value not in allowed:
            raise UsageError(
                f"{where}: field {field!r} must be {' or '.join(map(repr, allowed))} for linrnn's gated_deltanet "
                f"model, got {value!r}"
            )
    missing = [field for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim")
               if field not in fla_config]  # fmt: skip
    if missing:
        raise UsageError(f"{where}: missing fields {missing}")
    head_dim, expand_v = fla_config["head_dim"], fla_config.get("expand_v", 2.0)
    head_v_dim = head_dim * expand_v
    if head_v_dim != int(head_v_dim):
        raise UsageError(f"{where}: head_dim * expand_v must be an integer, got {head_dim} * {expand_v}")
    eps = fla_config.get("norm_eps", 1e-6)
    mixer = dict(head_k_dim=head_dim, head_v_dim=int(head_v_dim), conv_size=fla_config.get("conv_size", 4),
                 allow_neg_eigval=fla_config.get("allow_neg_eigval", False), norm_eps=eps, backend=backend)  # fmt: skip
    try:
        return ModelConfig(
            cell="gated_deltanet",
            vocab_size=fla_config["vocab_size"],
            hidden_size=fla_config["hidden_size"],
            num_layers=fla_config["num_hidden_layers"],
            num_heads=fla_config["num_heads"],
            intermediate_size=intermediate_size or fla_config.get("intermediate_size"),
            tie_embeddings=fla_config.get("tie_word_embeddings", False),
            norm_eps=eps,
            init_std=fla_config.get("initializer_range", 0.02),
            mixer=mixer,
        )
    except ValidationError as error:
        raise UsageError(f"{where}: {one_line(error)}") from error


def from_fla(source: str | Path | nn.Module, backend: str = "auto") -> LanguageModel:
    """linrnn's model holding an FLA Gated DeltaNet's weights, from a folder (``config.json`` and safetensors, as
    ``save_pretrained`` writes it) or from a loaded FLA model (``GatedDeltaNetForCausalLM``). Its logits equal
    FLA's up to the kernels' rounding. ``backend`` is the mixers' (``linrnn.kernels.use_triton``)."""
    if isinstance(source, nn.Module):
        fla_config = source.config.to_dict()
        weights = {name: tensor.detach() for name, tensor in source.state_dict().items()}
        where = f"FLA model {type(source).__name__}"
    else:
        folder = Path(source)
        fla_config, weights = _read_folder(folder)
        where = f"FLA checkpoint {folder}"
    first_mlp = weights.get("model.layers.0.mlp.gate_proj.weight")
    config = config_from_fla(fla_config, None if first_mlp is None else first_mlp.shape[0], backend)
    model = LanguageModel(config)
    if config.tie_embeddings:  # save_pretrained stores a tied readout once, under the embedding's name
        weights.pop("lm_head.weight", None)
    expected = {
        fla_name(name): name for name in model.state_dict() if not (config.tie_embeddings and name == "lm_head.weight")
    }
    unknown, absent = sorted(set(weights) - set(expected)), sorted(set(expected) - set(weights))
    if unknown or absent:
        raise UsageError(
            f"{where}: its tensors do not match a {config.num_layers}-layer gated_deltanet model: "
            f"unexpected {_few(unknown)}, missing {_few(absent)}"
        )
    state, shapes = {}, {name: tensor.shape for name, tensor in model.state_dict().items()}
    for fla, linrnn_name in expected.items():
        wanted = shapes[linrnn_name]
        if weights[fla].shape != wanted:
            raise UsageError(f"{where}: tensor {fla!r} must have shape {list(wanted)}, got {list(weights[fla].shape)}")
        state[linrnn_name] = weights[fla]
    model.load_state_dict(state, strict=not config.tie_embeddings)
    return model


def to_fla(model: LanguageModel, folder: str | Path) -> Path:
    """Write ``model`` (a gated_deltanet ``LanguageModel`` without linrnn-only options) as an FLA checkpoint:
    ``folder/config.json`` and ``folder/model.safetensors`` (fp32), for ``GatedDeltaNetForCausalLM.from_pretrained``.
    An existing ``config.json`` or ``model.safetensors`` there is not overwritten (``UsageError``)."""
    from safetensors.torch import save_file

    config, mixer = model.config, model.layers[0].mixer.config
    differences = {
        "cell": (config.cell, "gated_deltanet"),
        "logit_multiplier": (config.logit_multiplier, 1.0),
        "readout_bias": (config.readout_bias, False),
        "mixer.use_rope": (mixer.use_rope, False),
        "mixer.output_multiplier": (mixer.output_multiplier, 1.0),
        "mixer.norm_eps": (mixer.norm_eps, config.norm_eps),
        "mixer.use_short_conv": (mixer.use_short_conv, True),
    }
    for field, (value, needed) in differences.items():
        if value != needed:
            raise UsageError(f"to_fla: FLA's Gated DeltaNet needs model config {field} = {needed!r}, got {value!r}")
    expand_v = mixer.head_v_dim / mixer.head_k_dim
    if int(mixer.head_k_dim * expand_v) != mixer.head_v_dim:
        raise UsageError(f"to_fla: FLA derives head_v_dim = int(head_dim * expand_v), which cannot give "
                         f"{mixer.head_v_dim} from head_dim {mixer.head_k_dim}")  # fmt: skip
    folder = Path(folder)
    existing = [name for name in ("config.json", "model.safetensors") if (folder / name).exists()]
    if existing:
        raise UsageError(f"to_fla: {folder} already holds {existing}; choose an empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    fla_config = {
        "model_type": FLA_MODEL_TYPE,
        "architectures": ["GatedDeltaNetForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_heads": config.num_heads,
        "head_dim": mixer.head_k_dim,
        "expand_v": expand_v,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "swish",
        "use_gate": True,
        "output_gate_activation": "swish",
        "use_short_conv": True,
        "conv_size": mixer.conv_size,
        "allow_neg_eigval": mixer.allow_neg_eigval,
        "norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
    }
    state = {fla_name(name): tensor.detach().float().cpu().contiguous() for name, tensor in model.state_dict().items()
             if not (config.tie_embeddings and name == "lm_head.weight")}  # fmt: skip
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(fla_config, indent=2) + "\n")
    return folder


def _read_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``config.json`` and the tensors of ``model.safetensors`` or of the shards its index names."""
    from safetensors.torch import load_file

    where = f"FLA checkpoint {folder}"
    if not (folder / "config.json").is_file():
        raise UsageError(f"{where}: expected a folder with config.json (save_pretrained's), found none")
    try:
        fla_config = json.loads((folder / "config.json").read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"{where}: config.json is not JSON ({error})") from error
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    elif (folder / "model.safetensors").is_file():
        shards = ["model.safetensors"]
    elif any(folder.glob("*.bin")):
        raise UsageError(
            f"{where}: holds only pickled weights (*.bin); linrnn reads safetensors and does not unpickle files it "
            "did not write (save the model with save_pretrained(..., safe_serialization=True))"
        )
    else:
        raise UsageError(f"{where}: expected model.safetensors or model.safetensors.index.json, found neither")
    weights: dict[str, Tensor] = {}
    for shard in shards:
        weights |= load_file(folder / shard)
    return fla_config, weights


def _few(names: list[str]) -> str:
    return "none" if not names else ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
