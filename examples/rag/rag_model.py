"""The untrained model the warm start begins from: a tokenizer and a fresh tiny Llama.

The tokenizer learns its pieces from a *different* generated world, whose names share no word with
the real one: its merges are the documents' fixed words and the syllables names are made of, never a
whole training name. A training name and a held-out name are then spelt from the same kind of pieces,
so copying a name piece by piece, which the warm start teaches on training names, works on held-out
ones too.
"""

from __future__ import annotations

import json
import random
import re
from functools import cache

from rag_data import TEMPLATES, default_world
from rag_data.corpus import part_documents
from rag_data.world import BOOK_SUFFIXES, COMPANY_SUFFIXES, fresh_word, generate_world, name_words
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.models import build_tokenizer, tiny_llama
from reinforge.training.sft_rewrite import rename_words

SEARCH_CALL_PREFIX = '{"name":"search","arguments":{"query":"'
"""The fixed text before every query, as the chat template writes it: one token, so the model copies a
name over a short distance."""
TOKENIZER_WORLD_SEED = 7
"""The seed of the stand-in world the tokenizer is trained on (the real world's seed is 0)."""


def tokenizer_corpus() -> list[str]:
    """Documents, questions, answers and search calls of a stand-in world with names of its own."""
    stand_in = generate_world(seed=TOKENIZER_WORLD_SEED, avoid=name_words(default_world())).train
    lines = [d.text for d in part_documents(stand_in)]
    names = list(stand_in.names())
    for i, template in enumerate(TEMPLATES):
        lines += [template.question.format(n) for n in names[i :: len(TEMPLATES)]]
    lines += [f"ANSWER: {n}" for n in names[::3]]
    lines += [json.dumps({"query": n}, separators=(",", ":")) for n in names[1::3]]
    return [*lines, "search(query): Search the wiki"]


@cache
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(
        tokenizer_corpus(), vocab_size=640, special_tokens=[SEARCH_CALL_PREFIX, "ANSWER: "]
    )


def fresh_model() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tokenizer()
    return tiny_llama(tok, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512), tok


_NAME_WORD = re.compile(r"\b[A-Z][a-z]{3,8}\b")


@cache
def _training_name_words() -> frozenset[str]:
    """The words of training entity names that a rewrite replaces (not the kind words such as "Labs")."""
    train = default_world().train
    kinds = {*COMPANY_SUFFIXES, *BOOK_SUFFIXES}
    return frozenset(w for name in train.names() for w in name.split() if w not in kinds)


@cache
def _every_name_word() -> frozenset[str]:
    return name_words(default_world())


def fresh_names(segments: list[str], rng: random.Random) -> list[str]:
    """A recorded conversation with every training name word replaced by a new word of the same kind,
    the same new word for each occurrence in the conversation (`[warm_start] rewrite`).

    The new words are none of the world's (so no held-out name reaches training), so each time SFT
    draws the conversation its people, companies and places have names the model has never seen,
    and copying them from the question and the pages is the only way to predict them.
    """
    words, avoid = _training_name_words(), _every_name_word()
    return rename_words(segments, _NAME_WORD, words.__contains__, lambda: fresh_word(rng, set(), avoid))
