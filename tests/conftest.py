"""Fixtures for the whole suite: the converted SmolLM2 in a models cache of the session's own, converted
once per test session and shared by every folder that loads the real model (models, examples, benchmarks)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from reinforge.models import MODELS_DIR_ENV_VAR, convert, resolve_model

SMOLLM2 = "smollm2-135m-instruct"
SMOLLM2_PARAMETERS = 134_515_008


@pytest.fixture(scope="session")
def smollm2_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A models cache holding the converted SmolLM2 (converted once for the whole session)."""
    cache = tmp_path_factory.mktemp("models-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MODELS_DIR_ENV_VAR, str(cache))
        patch.setattr(convert, "_logits", _recording(convert._logits))
        resolve_model(SMOLLM2)
    yield cache


CHECKED_LOGITS: list[tuple[bool, torch.Tensor]] = []
"""The conversion's own check, as it ran: (was the model the GGUF load, its logits)."""


def _recording(
    logits: Callable[[PreTrainedModel, torch.Tensor], torch.Tensor],
) -> Callable[..., torch.Tensor]:
    def record(model: PreTrainedModel, ids: torch.Tensor) -> torch.Tensor:
        result = logits(model, ids)
        CHECKED_LOGITS.append((getattr(model, "hf_quantizer", None) is not None, result))
        return result

    return record
