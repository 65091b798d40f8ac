"""Incremental detokenization and stop-string matching.

Decoding a growing token list from scratch every step is quadratic; decoding only a short window
(the tokens since the last emitted character boundary) is linear and still right for byte-level BPE,
where one character may span several tokens: a delta ending in U+FFFD is held back until complete.
"""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase


class IncrementalDetokenizer:
    """Turns tokens appended one step at a time into text appended one step at a time."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""

    def _decode(self, tokens: list[int]) -> str:
        return str(
            self._tokenizer.decode(tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        )

    def push(self, tokens: list[int]) -> str:
        """Add tokens; return the text they completed (possibly empty)."""
        self._tokens.extend(tokens)
        prefix = self._decode(self._tokens[self._prefix_offset : self._read_offset])
        full = self._decode(self._tokens[self._prefix_offset :])
        # A trailing U+FFFD is usually a character whose bytes are still coming; a character has at
        # most 4 bytes, so after 4 more tokens it is really invalid output and is let through.
        waiting = full.endswith("\ufffd") and len(self._tokens) - self._read_offset < 4
        if len(full) <= len(prefix) or waiting:
            return ""
        delta = full[len(prefix) :]
        self._prefix_offset, self._read_offset = self._read_offset, len(self._tokens)
        self.text += delta
        return delta


def find_stop(text: str, stops: list[str], new_chars: int) -> int | None:
    """Index where the earliest stop string starts, looking only where the last `new_chars` could matter."""
    longest = max(len(s) for s in stops)
    start = max(0, len(text) - new_chars - longest + 1)
    hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
    return min(hits) if hits else None
