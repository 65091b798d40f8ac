"""Split a step's transitions into micro-batches that fit a token budget.

The budget counts padded tokens (rows x longest row), since that is what a forward pass costs; sorting
by length first keeps rows of similar length together, so little of the budget goes to padding. Rows
with the same prompt (a GRPO group) are kept next to each other, longest prompt first: a micro-batch
then holds whole groups, and the update encodes each group's prompt once (`shared_prefix`) instead
of once per row. Sorted by total length alone, a group's rows scattered over the micro-batches and
a real model's 400-token prompt was encoded for every row.
"""

from __future__ import annotations

from collections.abc import Sequence

from reinforge.errors import InvalidRequestError
from reinforge.types import Transition


def transition_length(t: Transition) -> int:
    return len(t.prompt_ids) + len(t.response_ids)


def _order_key(t: Transition) -> tuple[int, tuple[int, ...], int]:
    """Longest prompt first, the same prompt's rows together, then longest row first."""
    return len(t.prompt_ids), tuple(t.prompt_ids), transition_length(t)


def micro_batches(transitions: Sequence[Transition], max_tokens: int) -> list[list[int]]:
    """Indices into `transitions`, grouped so each group's padded size is at most `max_tokens`.

    A single transition longer than the budget gets a micro-batch of its own (it can't be split
    without changing the loss), so the budget is a target, not a hard cap, for such outliers.
    """
    if max_tokens < 1:
        raise InvalidRequestError(f"max_tokens must be positive, got {max_tokens}")
    order = sorted(range(len(transitions)), key=lambda i: _order_key(transitions[i]), reverse=True)
    batches: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in order:
        length = transition_length(transitions[i])
        new_width = max(width, length)
        if current and new_width * (len(current) + 1) > max_tokens:
            batches.append(current)
            current, new_width = [], length
        current.append(i)
        width = new_width
    if current:
        batches.append(current)
    return batches
