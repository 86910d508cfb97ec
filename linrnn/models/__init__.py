"""The generic language model, its config and presets."""

from linrnn.models.config import PRESETS, ModelConfig, list_presets, model_config
from linrnn.models.lm import LanguageModel, build_model, load_checkpoint, save_checkpoint


def __getattr__(name: str):
    """``linrnn.models.generate`` is ``linrnn.inference.generate``, imported on first use: linrnn.inference imports
    this package's lm module, so importing it here at load time would be a cycle."""
    if name == "generate":
        from linrnn.inference import generate

        return generate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
