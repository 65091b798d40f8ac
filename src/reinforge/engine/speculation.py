"""Draft tokens for speculative decoding from a sequence's own context ("prompt lookup", vLLM's
`ngram` method).

An agent's output copies tool names, argument names and JSON from its system prompt, and greedy text
often repeats itself: when the last few tokens occurred earlier in the prompt or the output, the
tokens that followed them then are a cheap guess of what follows now. The engine feeds the guesses
with the sequence's next token in one forward and keeps the longest prefix the model itself would
have produced (`Engine`, docs/engine.md "Speculative decoding"), so a guess costs compute, never
correctness.

Pure bookkeeping over token lists: nothing here touches a tensor or the model.
"""

from __future__ import annotations

NGRAM_MAX = 3
"""The longest suffix looked up: a longer match predicts better, and is tried first."""
NGRAM_MIN = 2
"""The shortest suffix looked up: a single token matches too often to predict what follows (on agent
replies a 1-token match was right far less often than a 2-token one; docs/engine.md, "Speculative
decoding"), and a wrong draft costs compute."""

CHEAP_ROWS = {"cpu": 16}
"""Tokens one forward can take, per device type, before each more costs about what a decoded token
does: below it a forward is bound by reading the weights and the per-layer overhead, above it by the
matmuls, where a draft that is mostly rejected only costs. Drafts only fill a verify forward up to
this (measured: docs/engine.md, "Speculative decoding")."""
CHEAP_ROWS_ACCELERATOR = 256
"""The same on a GPU, where a forward of a few hundred tokens costs about what one does (a guess: not
measured on this project's machines)."""


class NgramDrafter:
    """One sequence's index of where each n-gram of its history (prompt + generated tokens) last
    occurred, grown as the history grows, so a proposal costs a few dictionary look-ups instead of
    a scan of the whole history every step."""

    def __init__(self, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN) -> None:
        self._sizes = list(range(max_n, min_n - 1, -1))
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self._indexed = 0

    def propose(self, history: list[int], limit: int) -> tuple[list[int], int]:
        """Up to `limit` tokens that followed the most recent earlier occurrence of the history's last
        n tokens (the longest n that occurred before), and that n (a longer match is likelier right);
        none (and 0) when no suffix occurred before. Each call's `history` extends the previous
        call's (a sequence only grows)."""
        if limit <= 0:
            return [], 0
        self._index(history)
        for n in self._sizes:
            if len(history) <= n:
                continue
            follows = self._last[n].get(tuple(history[-n:]))
            if follows is not None:
                return history[follows : follows + limit], n
        return [], 0

    def _index(self, history: list[int]) -> None:
        """Record, for each n-gram whose next token is known, the position of that next token (the
        history only ever grows, so positions already indexed stay true)."""
        for follows in range(max(self._indexed, 1), len(history)):
            for n, last in self._last.items():
                if follows >= n:
                    last[tuple(history[follows - n : follows])] = follows
        self._indexed = len(history)


def share_rows(proposals: list[tuple[list[int], int]], room: int) -> list[list[int]]:
    """Each sequence's drafts cut so that all of them together are at most `room` tokens, the drafts of
    the longest matches kept first (in batch order among equal ones)."""
    drafts: list[list[int]] = [[] for _ in proposals]
    for i in sorted(range(len(proposals)), key=lambda i: -proposals[i][1]):
        if room <= 0:
            break
        draft = proposals[i][0][:room]
        drafts[i] = draft
        room -= len(draft)
    return drafts
