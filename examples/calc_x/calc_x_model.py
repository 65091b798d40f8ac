"""The untrained model the warm start begins from: the demo's calc tokenizer and a fresh 1.1M Llama."""

from __future__ import annotations

from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.demo.warm_start import load_warm_start
from reinforge.models import tiny_llama


def fresh_model() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    """Randomly initialised weights; only the tokenizer (trained on calc text) is reused."""
    _, tokenizer = load_warm_start()
    return tiny_llama(tokenizer, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512), tokenizer
