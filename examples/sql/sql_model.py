"""The untrained model the warm start begins from: a tokenizer and a fresh tiny Llama.

The tokenizer learns its pieces from the training text with every table and column word swapped for
an invented one, drawn afresh at each use: its merges are SQL, the question templates and the letter
groups English words are made of, never a whole table or column name. The invented words come from a
letter model of the training schemas' own words (`mountain` and `height` are held out; `meadow` and
`weight` are not), so a held-out name is spelt from the same kind of pieces the warm start learnt to
copy. Spaces are tokens of their own (`spaces_apart`): a name is the same pieces in the question, in
`AVG(height)` and after `T1.`, and copying it is copying those pieces. The fresh names SFT draws are
half such words and half runs of random pieces, which no sense of spelling predicts.
"""

from __future__ import annotations

import random
import re
from functools import cache

from sql_data import DOMAINS, TRAIN_DOMAINS, corpus_text, train_tasks
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from reinforge.models import build_tokenizer, tiny_llama
from reinforge.training.sft_rewrite import rename_words

PROMPT_MARKERS = ["\nQ: ", "\nSQL: ", "\nRows: ", "\nFix:"]
SCRAMBLED_RATE = 0.5
"""How often a fresh name is a run of random name pieces rather than an English-looking word."""
KEPT_WORDS = frozenset({"id", "name"})
"""Name words every schema shares (`<table>_id`, `name`): structure, kept whole like SQL keywords."""
_WORD = re.compile(r"[a-z]+")
_START, _END = "^", "$"


@cache
def name_words(domains: tuple[str, ...] = tuple(DOMAINS)) -> frozenset[str]:
    """Every word of every table and column name of `domains` (all: training and held-out alike)."""
    names = (n for d in domains for t in DOMAINS[d].tables for n in (t.name, *(c.name for c in t.columns)))
    return frozenset(w for n in names for w in n.split("_")) - KEPT_WORDS


def training_name_words() -> frozenset[str]:
    """The table and column words of the training schemas only: what invented words imitate."""
    return name_words(TRAIN_DOMAINS)


@cache
def _next_letters() -> dict[str, tuple[str, ...]]:
    """For each two letters of a training name word, the letters that follow them there (with
    repeats, so a draw follows their frequency); `^` pads a word's start, `$` marks its end."""
    follows: dict[str, list[str]] = {}
    for word in sorted(training_name_words()):
        padded = _START * 2 + word + _END
        for i in range(2, len(padded)):
            follows.setdefault(padded[i - 2 : i], []).append(padded[i])
    return {context: tuple(letters) for context, letters in follows.items()}


def _invented(rng: random.Random, banned: frozenset[str]) -> str:
    """An English-looking word of 3-10 letters from the training words' letter model, none of
    `banned` (the schemas' words: no held-out name may reach the training text)."""
    follows = _next_letters()
    while True:
        word, context = "", _START * 2
        while len(word) <= 10:
            letter = rng.choice(follows[context])
            if letter == _END:
                break
            word += letter
            context = context[1] + letter
        if 3 <= len(word) <= 10 and word not in banned:
            return word


def tokenizer_corpus(seed: int = 0) -> list[str]:
    """The training text with each table and column word replaced by an invented word at each use."""
    words = name_words()
    rng = random.Random(f"sql-tokenizer:{seed}")

    def swap(match: re.Match[str]) -> str:
        return _invented(rng, words) if match.group(0) in words else match.group(0)

    return [_WORD.sub(swap, line) for line in corpus_text(train_tasks()).splitlines()]


@cache
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(
        tokenizer_corpus(), vocab_size=1024, special_tokens=PROMPT_MARKERS, spaces_apart=True
    )


def fresh_model() -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast]:
    tok = tokenizer()
    return tiny_llama(tok, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512), tok


_NAME_WORD = re.compile(r"(?<![A-Za-z0-9])[a-z]+(?![A-Za-z0-9])")
"""A lowercase word on its own or between underscores (`birth` and `year` in `birth_year`), never the
inside of a capitalised value such as 'Athens'."""


@cache
def _never_invented() -> frozenset[str]:
    """What a fresh name may not be: a schema's word, or a word every schema shares."""
    return name_words() | KEPT_WORDS


@cache
def _name_pieces() -> tuple[str, ...]:
    """The tokenizer's pieces made of lowercase letters only: what a scrambled name is built from."""
    return tuple(sorted(p for p in tokenizer().get_vocab() if _WORD.fullmatch(p)))


def _scrambled(rng: random.Random, banned: frozenset[str]) -> str:
    """A name of one to three pieces drawn uniformly: no letter model predicts where it goes or ends,
    so only copying from the prompt does (a held-out English word is as surprising to a letter model
    of the training words)."""
    pieces = _name_pieces()
    while True:
        word = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 3)))
        if 3 <= len(word) <= 12 and word not in banned:
            return word


def _fresh_word(rng: random.Random, banned: frozenset[str]) -> str:
    return _scrambled(rng, banned) if rng.random() < SCRAMBLED_RATE else _invented(rng, banned)


def fresh_names(segments: list[str], rng: random.Random) -> list[str]:
    """A recorded graph call with every table and column word replaced by an invented word, the same
    one at each use in the call (`[warm_start] rewrite`).

    Schema, question, queries and rows name tables and columns with the same words, so the call stays
    consistent; each time SFT draws it the names are new, and copying them from the prompt is the only
    way to predict them, as it is on a held-out database. Half the new words are English-looking, half
    scrambled pieces, so the model learns to trust the prompt over its own sense of spelling.
    """
    banned = _never_invented()
    return rename_words(segments, _NAME_WORD, name_words().__contains__, lambda: _fresh_word(rng, banned))
