"""Models: tiny causal LMs and their tokenizer built locally (the embedded default policy needs no
hub), and real models from pip packages or GGUF files, converted once into a cache of Hugging Face
folders (`resolve_model`)."""

from typing import TYPE_CHECKING, Any

from reinforge.models.cache import ENV_VAR as MODELS_DIR_ENV_VAR
from reinforge.models.cache import CachedModel, list_cached, models_dir, remove_cached
from reinforge.models.chat_template import CHAT_TEMPLATE, TOOL_CALL_END, TOOL_CALL_START
from reinforge.models.errors import ModelPackageMissingError, ModelSourceError
from reinforge.models.registry import PACKAGED_MODELS, PackagedModel
from reinforge.models.resolve import resolve_model
from reinforge.models.tokenizer import build_tokenizer

if TYPE_CHECKING:
    from reinforge.models.factory import tiny_llama, tiny_qwen2

_LAZY = frozenset({"tiny_llama", "tiny_qwen2"})


def __getattr__(name: str) -> Any:
    """The model builders import torch and transformers (0.35 GB resident): loaded on first use, so
    that the `reinforge` command, and a training run's `reinforge runner` children, start without."""
    if name in _LAZY:
        from reinforge.models import factory

        return getattr(factory, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHAT_TEMPLATE",
    "MODELS_DIR_ENV_VAR",
    "PACKAGED_MODELS",
    "TOOL_CALL_END",
    "TOOL_CALL_START",
    "CachedModel",
    "ModelPackageMissingError",
    "ModelSourceError",
    "PackagedModel",
    "build_tokenizer",
    "list_cached",
    "models_dir",
    "remove_cached",
    "resolve_model",
    "tiny_llama",
    "tiny_qwen2",
]
