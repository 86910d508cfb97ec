"""linrnn: linear-RNN token mixers (GLA, DeltaNet, Gated DeltaNet, KDA, GammaNet) on one generalized recurrence.

Public API::

    linrnn.ops.gated_delta_rule(q, k, v, g, beta)      # per-cell ops, FLA conventions
    linrnn.list_cells(), linrnn.get_cell("gdn")        # registry (the recurrence cells)
    linrnn.register_cell(linrnn.CellSpec(...))          # a cell of your own, in your own file
    linrnn.list_mixers()                               # the cells and softmax attention ("attention")
    linrnn.build_mixer("kda", hidden_size, num_heads)  # one mixer layer
    linrnn.build_model("gdn", preset="byte-tiny")           # a language model
    linrnn.generate(model, prompt_ids, max_new_tokens)  # through the engine; [T], [B, T] or a list of prompts
    linrnn.Engine(model, slots=8).generate(prompts, linrnn.Sampling(temperature=0))  # batched decoding
    linrnn.param_roles(model)                          # {parameter name: role}
    linrnn.from_fla("fla-gdn-folder"), linrnn.to_fla(model, "folder")  # FLA Gated DeltaNet checkpoints
    model.save_pretrained("folder"), linrnn.models.LanguageModel.from_pretrained("folder")  # Hugging Face folders
    transformers.AutoModelForCausalLM.from_pretrained("folder")  # the same, once linrnn is imported (models.hf)
"""

from linrnn.inference import Engine, Sampling, generate
from linrnn.kernels import ops
from linrnn.kernels.structure import Structure
from linrnn.models import ModelConfig, build_model, list_presets, load_checkpoint
from linrnn.models.fla_checkpoints import from_fla, to_fla
from linrnn.models.hf import register_with_transformers
from linrnn.recurrences import (
    CellSpec,
    LinearRNNMixer,
    MixerConfig,
    MixerState,
    build_mixer,
    get_cell,
    list_cells,
    list_mixers,
    param_roles,
    register_cell,
    unregister_cell,
)

__version__ = "0.1.0"

register_with_transformers()  # linrnn's classes in transformers' Auto classes, without importing transformers

__all__ = [
    "CellSpec",
    "Engine",
    "LinearRNNMixer",
    "MixerConfig",
    "Sampling",
    "Structure",
    "MixerState",
    "ModelConfig",
    "build_mixer",
    "build_model",
    "from_fla",
    "generate",
    "get_cell",
    "list_cells",
    "list_mixers",
    "list_presets",
    "load_checkpoint",
    "ops",
    "param_roles",
    "register_cell",
    "to_fla",
    "unregister_cell",
]
