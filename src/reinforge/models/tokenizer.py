"""A byte-level BPE tokenizer trained locally on the task's own text (no hub access).

Why these choices: a tiny model learns arithmetic copying far better when every digit is its own token,
so a `Digits(individual_digits=True)` pre-tokenizer runs before the byte-level split; the vocabulary is
small (hundreds) so the embedding table does not dominate a ~1M-parameter model; and the chat/tool
markers are single tokens so a turn costs as few tokens as possible.

`spaces_apart=True` makes each space a token of its own: a word is then spelt with the same pieces
after a space, a bracket or a dot, which a model that copies names from its prompt into code needs
(`AVG(height)` and `... have height` share the pieces of `height`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from reinforge.errors import InvalidRequestError
from reinforge.models.chat_template import (
    BOS,
    CHAT_TEMPLATE,
    EOS,
    PAD,
    ROLE_TOKENS,
    TOOL_CALL_END,
    TOOL_CALL_START,
)

CORE_SPECIAL_TOKENS: tuple[str, ...] = (BOS, EOS, PAD, *ROLE_TOKENS.values())
"""Control tokens: never produced by text, dropped by `decode(skip_special_tokens=True)`."""
TOOL_TOKENS: tuple[str, ...] = (TOOL_CALL_START, TOOL_CALL_END)
"""Added as single, non-special tokens (like Qwen2.5 does) so decoded text keeps the tool-call markup."""


def build_tokenizer(
    corpus: Iterable[str],
    vocab_size: int = 512,
    special_tokens: Sequence[str] = (),
    *,
    spaces_apart: bool = False,
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `corpus` and wrap it for transformers.

    `special_tokens` are extra atomic markers the task uses (e.g. `<calc>`); like the tool-call
    markers they are one token each but stay in decoded text. `vocab_size` counts the BPE vocabulary
    including the control tokens; the extra markers come on top (`len(tokenizer)` is the total).
    `spaces_apart` keeps every space a token of its own, never merged into the word after it.
    """
    extra = [
        t for t in dict.fromkeys(special_tokens) if t not in CORE_SPECIAL_TOKENS and t not in TOOL_TOKENS
    ]
    if any(not t for t in extra):
        raise InvalidRequestError("special tokens must be non-empty strings")
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    minimum = len(alphabet) + len(CORE_SPECIAL_TOKENS)
    if vocab_size < minimum:
        raise InvalidRequestError(
            f"vocab_size={vocab_size} is too small: the byte alphabet and control tokens need {minimum}"
        )
    atomic = [*CORE_SPECIAL_TOKENS, *TOOL_TOKENS, *extra]

    tok = Tokenizer(models.BPE())
    splits: list[pre_tokenizers.PreTokenizer] = [pre_tokenizers.Digits(individual_digits=True)]
    if spaces_apart:
        splits.append(pre_tokenizers.Split(" ", behavior="isolated"))
    splits.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(CORE_SPECIAL_TOKENS),
        initial_alphabet=alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(_without_markers(corpus, atomic), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in (*TOOL_TOKENS, *extra)])

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=2048,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def _without_markers(corpus: Iterable[str], markers: Sequence[str]) -> Iterator[str]:
    """Split each text around the atomic markers, so BPE does not spend merges on their pieces."""
    pattern = re.compile("|".join(re.escape(m) for m in sorted(markers, key=len, reverse=True)))
    for text in corpus:
        for piece in pattern.split(text):
            if piece:
                yield piece
