"""Name LLM calls after the agent role that made them, from the framework's own role spans.

A framework hook records each agent/node run as an agent step (`reinforge.step.kind=agent` with
`reinforge.agent.name`). An LLM call without an explicit agent name (gateway URL or `for_agent`) is
named after the innermost role that encloses it: through its parent chain first (a client that sends
`traceparent` nests its calls under the role), else by time, when the call ran entirely inside the
role's interval. Roles are nested only through their parent chain: two roles that merely overlap in
time may be parallel branches, so a call inside differently named overlapping roles stays unnamed
rather than guessed, and is counted.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from reinforge import semconv
from reinforge.types import Span


@dataclass(frozen=True)
class RoleJoin:
    """What naming by role found for one attempt's calls."""

    names: dict[str, str]
    """LLM span id -> the role name it gets."""
    ambiguous: int
    """Calls inside differently named roles that overlap without nesting, left unnamed."""


@dataclass(frozen=True)
class _Role:
    span_id: str
    name: str
    start: float
    end: float
    ancestors: frozenset[str]
    """Span ids of the roles above this one in its parent chain."""

    def holds(self, start: float, end: float) -> bool:
        return self.start <= start and end <= self.end


def role_name(span: Span) -> str | None:
    """The role an agent step names, or None when `span` is not one."""
    if span.attributes.get(semconv.ATTR_STEP_KIND) != semconv.STEP_AGENT:
        return None
    name = span.attributes.get(semconv.ATTR_AGENT_NAME)
    return name if isinstance(name, str) and name else None


def _ancestors(span: Span, by_id: dict[str, Span]) -> Iterator[Span]:
    """The spans above `span` in its parent chain, innermost first (stops at a cycle or a gap)."""
    seen = {span.span_id}
    parent = span.parent_id
    while parent is not None and parent not in seen and (ancestor := by_id.get(parent)) is not None:
        seen.add(parent)
        yield ancestor
        parent = ancestor.parent_id


def _by_parent(span: Span, by_id: dict[str, Span]) -> str | None:
    return next((name for a in _ancestors(span, by_id) if (name := role_name(a)) is not None), None)


def _by_time(span: Span, roles: list[_Role]) -> tuple[str | None, bool]:
    """The innermost enclosing role's name, and whether enclosing roles disagree on it."""
    end = span.end_time if span.end_time is not None else span.start_time
    enclosing = [r for r in roles if r.holds(span.start_time, end)]
    innermost = {r.name for r in enclosing if not any(r.span_id in o.ancestors for o in enclosing)}
    if len(innermost) == 1:
        return innermost.pop(), False
    return None, len(innermost) > 1


def join_roles(attempt_spans: Sequence[Span], calls: Iterable[Span]) -> RoleJoin:
    """Role names for `calls`, LLM spans of the attempt whose spans are `attempt_spans`."""
    by_id = {s.span_id: s for s in attempt_spans}
    roles = [
        _Role(
            span_id=s.span_id,
            name=name,
            start=s.start_time,
            end=s.end_time if s.end_time is not None else math.inf,
            ancestors=frozenset(a.span_id for a in _ancestors(s, by_id) if role_name(a) is not None),
        )
        for s in attempt_spans
        if (name := role_name(s)) is not None
    ]
    names: dict[str, str] = {}
    ambiguous = 0
    if not roles:
        return RoleJoin(names, ambiguous)
    for call in calls:
        name = _by_parent(call, by_id)
        if name is None:
            name, unclear = _by_time(call, roles)
            ambiguous += unclear
        if name is not None:
            names[call.span_id] = name
    return RoleJoin(names, ambiguous)
