"""Gated DeltaNet and KDA checkpoints of flash-linear-attention (FLA) in and out of linrnn's model.

FLA's ``GatedDeltaNetForCausalLM`` (``model_type`` "gated_deltanet") is linrnn's generic model with the
``gated_deltanet`` cell, parameter for parameter: the same projections (FLA's ``a_proj`` is linrnn's decay
projection ``f_proj``), short convs, ``A_log``/``dt_bias`` gate, gated output norm, SwiGLU blocks and readout.
FLA's ``KDAForCausalLM`` ("kda") is the ``kda`` cell with FLA's output gate: a low-rank projection of rank
``head_v_dim`` with a bias, through a sigmoid (``output_gate="sigmoid"``, ``output_gate_low_rank``).
``from_fla`` renames the tensors and builds the model from FLA's config; ``to_fla`` writes a folder that FLA's
``from_pretrained`` reads. FLA variants without a linrnn counterpart are refused with the config field that
differs: hybrid attention layers (``attn``), grouped value heads (``num_v_heads``), no or a sigmoid output gate
(GDN), KDA's bounded gate (``safe_gate``, ``lower_bound``), attention residuals.

Weights are read from ``*.safetensors`` only (one file or an index of shards): linrnn does not unpickle files it did
not write, so a ``pytorch_model.bin`` is refused with that reason. Parameters load into fp32, as linrnn's models
train (bf16 autocast); ``model.to(torch.bfloat16)`` afterwards for bf16 inference.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError
from torch import Tensor, nn

from linrnn.errors import UsageError, one_line
from linrnn.models.config import ModelConfig
from linrnn.models.folders import read_json, safetensors_files
from linrnn.models.lm import LanguageModel
from linrnn.recurrences.registry import get_cell


@dataclass(frozen=True)
class Family:
    """An FLA model that is linrnn's generic model with one cell: its names and the config it needs."""

    cell: str  # linrnn's cell; FLA's model_type (config.json's) is its CellSpec.fla
    architecture: str
    mixer_names: dict[str, str]  # linrnn's name under "mixer." → FLA's under "attn."
    required: dict[str, tuple[Any, tuple]]  # FLA config field → (FLA's default, the values linrnn can take)
    output_gate: str  # linrnn's mixer option of that name

    @property
    def model_type(self) -> str:
        return get_cell(self.cell).fla


_SHARED_MIXER_NAMES = {
    **{f"{name}_proj.weight": f"{name}_proj.weight" for name in ("q", "k", "v", "b", "o")},
    **{f"{name}_conv.weight": f"{name}_conv1d.weight" for name in ("q", "k", "v")},
    "A_log": "A_log",
    "dt_bias": "dt_bias",
    "o_norm.weight": "o_norm.weight",
}
_SHARED_REQUIRED = {
    "attn": (None, (None,)),  # hybrid attention layers
    "num_v_heads": (None, (None,)),  # grouped value heads (equal to num_heads is fine too)
    "hidden_act": ("swish", ("swish", "silu")),
    "use_short_conv": (True, (True,)),
    "attnres_block_size": (None, (None,)),
}
_GDN = Family(
    cell="gated_deltanet",
    architecture="GatedDeltaNetForCausalLM",
    mixer_names={**_SHARED_MIXER_NAMES, "f_proj.weight": "a_proj.weight", "g_proj.weight": "g_proj.weight"},
    required={**_SHARED_REQUIRED, "use_gate": (True, (True,)), "output_gate_activation": ("swish", ("swish", "silu"))},
    output_gate="silu",
)
_KDA = Family(
    cell="kda",
    architecture="KDAForCausalLM",
    mixer_names={
        **_SHARED_MIXER_NAMES,
        **{f"{name}.{i}.weight": f"{name}.{i}.weight" for name in ("f_proj", "g_proj") for i in (0, 1)},  # low rank
        "g_proj.1.bias": "g_proj.1.bias",
    },
    required={**_SHARED_REQUIRED, "safe_gate": (False, (False,)), "lower_bound": (None, (None,))},
    output_gate="sigmoid",
)
FAMILIES = {family.model_type: family for family in (_GDN, _KDA)}
_BLOCK_NAMES = {
    "mixer_norm.weight": "attn_norm.weight",
    "mlp_norm.weight": "mlp_norm.weight",
    **{f"mlp.{name}_proj.weight": f"mlp.{name}_proj.weight" for name in ("gate", "up", "down")},
}
_GLOBAL_NAMES = {"embed.weight": "model.embeddings.weight", "norm.weight": "model.norm.weight",
                 "lm_head.weight": "lm_head.weight"}  # fmt: skip


def fla_name(linrnn_name: str, family: Family = _GDN) -> str:
    """FLA's name of a linrnn parameter: ``layers.3.mixer.f_proj.weight`` → ``model.layers.3.attn.a_proj.weight``
    (Gated DeltaNet)."""
    if linrnn_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[linrnn_name]
    match = re.fullmatch(r"layers\.(\d+)\.(mixer\.)?(.+)", linrnn_name)
    names = family.mixer_names if match and match[2] else _BLOCK_NAMES
    if match is None or match[3] not in names:
        raise KeyError(f"no FLA {family.model_type} name for linrnn parameter {linrnn_name!r}")
    return f"model.layers.{match[1]}.{'attn.' if match[2] else ''}{names[match[3]]}"


def config_from_fla(fla_config: dict[str, Any], intermediate_size: int | None = None, backend: str = "auto"
                    ) -> ModelConfig:  # fmt: skip
    """linrnn's ``ModelConfig`` of an FLA Gated DeltaNet or KDA config (``config.json``'s dict).
    ``intermediate_size``: the SwiGLU width read from the weights (FLA's config may leave it None and derive it)."""
    where = "FLA config"
    family = _family(fla_config, where)
    for field, (default, allowed) in family.required.items():
        value = fla_config.get(field, default)
        if field == "num_v_heads" and value == fla_config.get("num_heads"):
            continue
        if value not in allowed:
            raise UsageError(
                f"{where}: field {field!r} must be {' or '.join(map(repr, allowed))} for linrnn's {family.cell} "
                f"model, got {value!r}"
            )
    missing = [field for field in ("vocab_size", "hidden_size", "num_hidden_layers", "num_heads", "head_dim")
               if field not in fla_config]  # fmt: skip
    if missing:
        raise UsageError(f"{where}: missing fields {missing}")
    head_dim = fla_config["head_dim"]
    expand_v = fla_config.get("expand_v", 2.0 if family.cell == "gated_deltanet" else 1.0)  # FLA's defaults
    head_v_dim = head_dim * expand_v
    if head_v_dim != int(head_v_dim):
        raise UsageError(f"{where}: head_dim * expand_v must be an integer, got {head_dim} * {expand_v}")
    eps = fla_config.get("norm_eps", 1e-6)
    mixer = dict(head_k_dim=head_dim, head_v_dim=int(head_v_dim), conv_size=fla_config.get("conv_size", 4),
                 allow_neg_eigval=fla_config.get("allow_neg_eigval", False), norm_eps=eps, backend=backend,
                 output_gate=family.output_gate)  # fmt: skip
    if family.cell == "kda":  # FLA's KDA: both low-rank gates of rank head_v_dim
        mixer |= dict(gate_low_rank=int(head_v_dim), output_gate_low_rank=int(head_v_dim))
    try:
        return ModelConfig(
            cell=family.cell,
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


def _family(fla_config: dict[str, Any], where: str) -> Family:
    model_type = fla_config.get("model_type")
    if model_type not in FAMILIES:
        raise UsageError(f"{where}: expected model_type {' or '.join(map(repr, FAMILIES))} (FLA's Gated DeltaNet, "
                         f"KDA), got {model_type!r}")  # fmt: skip
    return FAMILIES[model_type]


def from_fla(source: str | Path | nn.Module, backend: str = "auto") -> LanguageModel:
    """linrnn's model holding an FLA Gated DeltaNet's or KDA's weights, from a folder (``config.json`` and
    safetensors, as ``save_pretrained`` writes it) or from a loaded FLA model (``GatedDeltaNetForCausalLM``,
    ``KDAForCausalLM``). Its logits equal FLA's up to the kernels' rounding. ``backend`` is the mixers'
    (``linrnn.kernels.use_triton``)."""
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
    family = FAMILIES[fla_config["model_type"]]  # config_from_fla has checked it
    model = LanguageModel(config)
    if config.tie_embeddings:  # save_pretrained stores a tied readout once, under the embedding's name
        weights.pop("lm_head.weight", None)
    shapes = {name: tensor.shape for name, tensor in _stored(model).items()}
    expected = {fla_name(name, family): name for name in shapes}
    unknown, absent = sorted(set(weights) - set(expected)), sorted(set(expected) - set(weights))
    if unknown or absent:
        raise UsageError(
            f"{where}: its tensors do not match a {config.num_layers}-layer {family.cell} model: "
            f"unexpected {_few(unknown)}, missing {_few(absent)}"
        )
    state = {}
    for fla, linrnn_name in expected.items():
        wanted = shapes[linrnn_name]
        if weights[fla].shape != wanted:
            raise UsageError(f"{where}: tensor {fla!r} must have shape {list(wanted)}, got {list(weights[fla].shape)}")
        state[linrnn_name] = weights[fla]
    if config.tie_embeddings:
        state["lm_head.weight"] = state["embed.weight"]  # the same parameter: loaded twice with one value
    model.load_state_dict(state)
    return model


def to_fla(model: LanguageModel, folder: str | Path) -> Path:
    """Write ``model`` (a gated_deltanet or kda ``LanguageModel`` in FLA's form, without linrnn-only options) as an
    FLA checkpoint: ``folder/config.json`` and ``folder/model.safetensors`` (fp32), for FLA's ``from_pretrained``.
    An existing ``config.json`` or ``model.safetensors`` there is not overwritten (``UsageError``)."""
    from safetensors.torch import save_file

    config, mixer = model.config, model.layers[0].mixer.config
    family = next((family for family in FAMILIES.values() if family.cell == config.cell), None)
    if family is None:
        cells = " or ".join(repr(family.cell) for family in FAMILIES.values())
        raise UsageError(f"to_fla: FLA's models take model config cell = {cells}, got {config.cell!r}")
    kda = family.cell == "kda"
    differences = {
        "logit_multiplier": (config.logit_multiplier, 1.0),
        "readout_bias": (config.readout_bias, False),
        "mixer.use_rope": (mixer.use_rope, False),
        "mixer.output_multiplier": (mixer.output_multiplier, 1.0),
        "mixer.norm_eps": (mixer.norm_eps, config.norm_eps),
        "mixer.use_short_conv": (mixer.use_short_conv, True),
        "mixer.output_gate": (mixer.output_gate, family.output_gate),
        "mixer.output_gate_low_rank": (mixer.output_gate_low_rank, mixer.head_v_dim if kda else None),
    }
    if kda:
        differences["mixer.gate_low_rank"] = (mixer.gate_low_rank or mixer.head_v_dim, mixer.head_v_dim)
    for field, (value, needed) in differences.items():
        if value != needed:
            raise UsageError(f"to_fla: FLA's {family.architecture} needs model config {field} = {needed!r}, "
                             f"got {value!r}")  # fmt: skip
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
        "model_type": family.model_type,
        "architectures": [family.architecture],
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_heads": config.num_heads,
        "head_dim": mixer.head_k_dim,
        "expand_v": expand_v,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "swish",
        "use_short_conv": True,
        "conv_size": mixer.conv_size,
        "allow_neg_eigval": mixer.allow_neg_eigval,
        "norm_eps": config.norm_eps,
        "tie_word_embeddings": config.tie_embeddings,
        "initializer_range": config.init_std,
    }
    if not kda:
        fla_config |= {"use_gate": True, "output_gate_activation": "swish"}
    state = {fla_name(name, family): tensor.detach().float().cpu().contiguous()
             for name, tensor in _stored(model).items()}  # fmt: skip
    save_file(state, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(fla_config, indent=2) + "\n")
    return folder


def _stored(model: LanguageModel) -> dict[str, Tensor]:
    """The model's tensors as an FLA checkpoint stores them: a tied readout only as the embedding."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        del state["lm_head.weight"]
    return state


def _read_folder(folder: Path) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """``config.json`` and the tensors of ``model.safetensors`` or of the shards its index names."""
    from safetensors.torch import load_file

    where = f"FLA checkpoint {folder}"
    if not (folder / "config.json").is_file():
        raise UsageError(f"{where}: expected a folder with config.json (save_pretrained's), found none")
    fla_config = read_json(folder / "config.json", where)
    if not isinstance(fla_config, dict):
        raise UsageError(f"{where}: config.json must hold an object, got {type(fla_config).__name__}")
    shards = safetensors_files(folder, where)
    weights: dict[str, Tensor] = {}
    for shard in shards:
        try:
            weights |= load_file(shard)
        except Exception as error:  # safetensors' own error type for bad headers, truncated files, ...
            raise UsageError(f"{where}: {shard.name} is not a readable safetensors file ({one_line(error)})") from error
    return fla_config, weights


def _few(names: list[str]) -> str:
    return "none" if not names else ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
