"""The generic language model, its config and presets."""

from linrnn.models.config import PRESETS, ModelConfig, list_presets, model_config
from linrnn.models.lm import LanguageModel, build_model, generate

__all__ = ["PRESETS", "LanguageModel", "ModelConfig", "build_model", "generate", "list_presets", "model_config"]
