"""Examples rewritten as text each time they are drawn: fresh names per epoch for a warm start.

A tiny model trained for many epochs on a few thousand recorded conversations learns their names by
heart instead of learning to copy names from its prompt, which is all a conversation about unseen
names needs. Renaming the entities of each conversation every time it is drawn (consistently within
the conversation) leaves copying as the only way to fit the data.

The rewrite works on text: an example's tokens are cut where the loss mask changes (context, then
trained tokens, then context...), each segment is decoded, the rewrite returns new text for every
segment, and each is encoded again. Segments are encoded on their own, as the engine sees them: a
prompt is encoded whole and a reply is generated after it. An example whose segments don't encode
back to exactly the recorded ids (a tokenizer that isn't lossless on them) is used as recorded.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

from transformers import PreTrainedTokenizerBase

from reinforge.training.sft import SftExample

TextRewrite = Callable[[list[str], random.Random], list[str]]
"""One conversation's text segments (context and trained, in order) to as many rewritten segments."""


def mask_segments(example: SftExample) -> list[tuple[int, list[int]]]:
    """The example's ids cut where the loss mask changes: (mask value, ids) in order."""
    segments: list[tuple[int, list[int]]] = []
    for token, flag in zip(example.input_ids, example.loss_mask, strict=True):
        if segments and segments[-1][0] == flag:
            segments[-1][1].append(token)
        else:
            segments.append((flag, [token]))
    return segments


class RewritingExamples:
    """An `augment` for `supervised_finetune`: each drawn example comes back with its text rewritten."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, rewrite: TextRewrite) -> None:
        self._tokenizer = tokenizer
        self._rewrite = rewrite
        self.kept_as_recorded = 0
        """Examples used unchanged because their ids don't survive decoding and encoding again."""
        self._texts: dict[int, tuple[SftExample, list[tuple[int, str]] | None]] = {}
        """Per example (by identity; the example is kept so its id can't be reused): its segments'
        mask values and texts, or None when they don't encode back. An example is drawn every epoch;
        its recorded text is decoded and checked once."""

    def _decode(self, ids: Sequence[int]) -> str:
        text = self._tokenizer.decode(
            list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        assert isinstance(text, str)  # one sequence decodes to one string
        return text

    def _encode(self, text: str) -> list[int]:
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _segment_texts(self, example: SftExample) -> list[tuple[int, str]] | None:
        cached = self._texts.get(id(example))
        if cached is not None and cached[0] is example:
            return cached[1]
        segments = [(flag, self._decode(ids), ids) for flag, ids in mask_segments(example)]
        lossless = all(self._encode(text) == ids for _, text, ids in segments)
        texts = [(flag, text) for flag, text, _ in segments] if lossless else None
        self._texts[id(example)] = (example, texts)
        return texts

    def __call__(self, example: SftExample, rng: random.Random) -> SftExample:
        segments = self._segment_texts(example)
        if segments is None:
            self.kept_as_recorded += 1
            return example
        rewritten = self._rewrite([text for _, text in segments], rng)
        if len(rewritten) != len(segments):
            raise ValueError(f"a text rewrite returned {len(rewritten)} segments for {len(segments)}")
        input_ids: list[int] = []
        loss_mask: list[int] = []
        for (flag, _), text in zip(segments, rewritten, strict=True):
            ids = self._encode(text)
            input_ids += ids
            loss_mask += [flag] * len(ids)
        return SftExample(input_ids=input_ids, loss_mask=loss_mask)


def rename_words(
    segments: list[str], pattern: re.Pattern[str], renamed: Callable[[str], bool], invent: Callable[[], str]
) -> list[str]:
    """Every match of `pattern` for which `renamed` holds replaced by a word from `invent`, the same
    new word at each use across the segments and a different one for each old word: a conversation
    about new entities that says the same things about them."""
    fresh: dict[str, str] = {}
    used: set[str] = set()

    def swap(match: re.Match[str]) -> str:
        word = match.group(0)
        if not renamed(word):
            return word
        if word not in fresh:
            new = invent()
            while new in used:
                new = invent()
            used.add(new)
            fresh[word] = new
        return fresh[word]

    return [pattern.sub(swap, text) for text in segments]
