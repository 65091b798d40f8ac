"""The untrained model the warm start begins from: a tokenizer trained on the training databases'
text and a fresh tiny Llama. Held-out schemas never reach the tokenizer, so their names are spelt
from word pieces the model has seen."""

from __future__ import annotations

from functools import cache

from sql_data import corpus_text, train_tasks
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.models import build_tokenizer, tiny_llama

PROMPT_MARKERS = ["\nQ: ", "\nSQL: ", "\nRows: ", "\nFix:"]


@cache
def tokenizer() -> PreTrainedTokenizerFast:
    lines = corpus_text(train_tasks()).splitlines()
    return build_tokenizer(lines, vocab_size=1024, special_tokens=PROMPT_MARKERS)


def fresh_model() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tokenizer()
    return tiny_llama(tok, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512), tok
