"""The untrained model the warm start begins from: a tokenizer trained on the training corpus and a
fresh tiny Llama. Held-out names never reach the tokenizer, so they are spelt from word pieces."""

from __future__ import annotations

import json
from functools import cache

from rag_data import corpus_text, train_tasks
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.models import build_tokenizer, tiny_llama

SEARCH_CALL_PREFIX = '{"name":"search","arguments":{"query":"'
"""The fixed text before every query, as the chat template writes it: one token, so the model copies a
name over a short distance."""


@cache
def tokenizer() -> PreTrainedTokenizerFast:
    lines = corpus_text(train_tasks()).splitlines()
    lines += ["search(query): Search the wiki", json.dumps({"query": "Paslas Labs"}, separators=(",", ":"))]
    return build_tokenizer(lines, vocab_size=640, special_tokens=[SEARCH_CALL_PREFIX, "ANSWER: "])


def fresh_model() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tokenizer()
    return tiny_llama(tok, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512), tok
