"""The real-model constants and the recorded conversion check, re-exported from the suite's conftest."""

from conftest import CHECKED_LOGITS, SMOLLM2, SMOLLM2_PARAMETERS

__all__ = ["CHECKED_LOGITS", "SMOLLM2", "SMOLLM2_PARAMETERS"]
