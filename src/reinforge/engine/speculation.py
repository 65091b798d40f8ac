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
NGRAM_MIN = 1
"""The shortest suffix looked up: one token still finds the JSON punctuation and names that follow."""


class NgramDrafter:
    """One sequence's index of where each n-gram of its history (prompt + generated tokens) last
    occurred, grown as the history grows, so a proposal costs a few dictionary look-ups instead of
    a scan of the whole history every step."""

    def __init__(self, max_n: int = NGRAM_MAX, min_n: int = NGRAM_MIN) -> None:
        self._sizes = list(range(max_n, min_n - 1, -1))
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._sizes}
        self._indexed = 0

    def propose(self, history: list[int], limit: int) -> list[int]:
        """Up to `limit` tokens that followed the most recent earlier occurrence of the history's last
        n tokens (the longest n that occurred before); none when no suffix occurred before. Each call's
        `history` extends the previous call's (a sequence only grows)."""
        if limit <= 0:
            return []
        self._index(history)
        for n in self._sizes:
            if len(history) <= n:
                continue
            follows = self._last[n].get(tuple(history[-n:]))
            if follows is not None:
                return history[follows : follows + limit]
        return []

    def _index(self, history: list[int]) -> None:
        """Record, for each n-gram whose next token is known, the position of that next token (the
        history only ever grows, so positions already indexed stay true)."""
        for follows in range(max(self._indexed, 1), len(history)):
            for n, last in self._last.items():
                if follows >= n:
                    last[tuple(history[follows - n : follows])] = follows
        self._indexed = len(history)
