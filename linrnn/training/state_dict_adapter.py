"""torchtitan's state-dict adapter for linrnn's models: torchtitan's model state dict ↔ the Hugging Face folder of
``LanguageModel.save_pretrained`` (``linrnn.models.hf``).

``TitanLanguageModel`` holds the ``LanguageModel`` as ``.model``, as ``LinrnnForCausalLM`` does, so the names are
the same: ``to_hf`` only leaves out the readout when it is the embedding (the folder stores a tied weight once),
``from_hf`` puts it back. ``hf_config`` is the folder's config.json. torchtitan builds the adapter with the run's
model config and ``hf_assets_path`` (linrnn's runs: the tokenizer folder); a ``model.safetensors.index.json`` there
gives the shard of each weight, as torchtitan's own adapters read it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from torchtitan.protocols.state_dict_adapter import StateDictAdapter

READOUT, EMBEDDING = "model.lm_head.weight", "model.embed.weight"


class LinrnnStateDictAdapter(StateDictAdapter):
    """``to_hf`` / ``from_hf`` between ``TitanLanguageModel``'s state dict and the HF folder's weights."""

    def __init__(self, model_config: Any, hf_assets_path: str | None):
        # torchtitan's base reads the index the same way, but warns when a tokenizer folder (linrnn's
        # hf_assets_path) has none, at every run
        self.model_config = model_config
        self.hf_assets_path = hf_assets_path
        self.fqn_to_index_mapping = None
        index = Path(hf_assets_path) / "model.safetensors.index.json" if hf_assets_path else None
        if index is not None and index.is_file():
            weight_map = json.loads(index.read_text())["weight_map"]
            self.fqn_to_index_mapping = {
                name: int(re.search(r"\d+", file).group(0)) for name, file in weight_map.items()
            }

    @property
    def tied(self) -> bool:
        return self.model_config.model_config().tie_embeddings

    def to_hf(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return {name: value for name, value in state_dict.items() if not (self.tied and name == READOUT)}

    def from_hf(self, hf_state_dict: dict[str, Any]) -> dict[str, Any]:
        state_dict = dict(hf_state_dict)
        if self.tied and EMBEDDING in state_dict:
            state_dict.setdefault(READOUT, state_dict[EMBEDDING])
        return state_dict

    def hf_config(self) -> dict[str, Any]:
        """The folder's config.json for this run's model: its ``ModelConfig`` with the multipliers the
        parametrization installs (``TitanLanguageModel.init_weights``; built here on the meta device)."""
        import torch

        from linrnn import parametrizations
        from linrnn.models import LanguageModel

        cfg = self.model_config
        with torch.device("meta"):
            model = LanguageModel(cfg.model_config())
            parametrizations.apply(model, cfg.parametrization, base_width=cfg.base_width, optimizer=cfg.optimizer,
                                   readout_zero_init=cfg.readout_zero_init,
                                   base_num_heads=cfg.base_num_heads)  # fmt: skip
        return LanguageModel.hf_config(model.config)
