"""The generic language model, its config and presets."""

from linrnn.models.config import PRESETS, ModelConfig, list_presets, model_config
from linrnn.models.lm import LanguageModel, build_model, generate, load_checkpoint, save_checkpoint

__all__ = [
    "PRESETS",
    "LanguageModel",
    "ModelConfig",
    "build_model",
    "generate",
    "list_presets",
    "load_checkpoint",
    "model_config",
    "save_checkpoint",
]
