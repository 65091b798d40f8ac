"""What an in-process agent calls: `emit_reward` and `span`.

Outside an attempt (an agent run by hand, a unit test of the agent) both are harmless: `span` runs its
body unchanged and records nothing, `emit_reward` records nothing and logs one warning. An agent
therefore runs the same with and without reinforge around it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from contextlib import ExitStack
from types import TracebackType
from typing import Any, Literal, ParamSpec, TypeVar, cast, overload

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode

from reinforge.errors import InvalidRequestError
from reinforge.semconv import (
    AIR_TOOL_ERROR,
    ATTR_AGENT_NAME,
    ATTR_AIR_SIGNAL,
    ATTR_REWARD_NAME,
    ATTR_REWARD_VALUE,
    ATTR_STEP_KIND,
    ATTR_TOOL_NAME,
    SPAN_FINAL_REWARD,
    SPAN_REWARD,
    STEP_CUSTOM,
    STEP_REWARD,
    STEP_TOOL,
)
from reinforge.tracing.context import current_attempt
from reinforge.tracing.processor import ATTR_JSON_KEYS, encode_attributes
from reinforge.tracing.provider import get_tracer

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")
StepKind = Literal["custom", "tool"]

_warned_outside = False


def _warn_outside(what: str) -> None:
    global _warned_outside
    if not _warned_outside:
        _warned_outside = True
        log.warning("%s called outside a reinforge attempt; nothing is recorded (warned once)", what)


def reward_value(value: object) -> float:
    """`value` as a finite float, or InvalidRequestError (bools are rejected: they hide bugs)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidRequestError(f"a reward must be a number, got {type(value).__name__}: {value!r}")
    result = float(value)
    if not math.isfinite(result):
        raise InvalidRequestError(f"a reward must be finite, got {result}")
    return result


def emit_reward(value: float, name: str | None = None, *, final: bool = False) -> None:
    """Record a reward for the current attempt.

    Intermediate rewards (the default) become `reinforge.reward` spans that credit assignment can use;
    `final=True` records the attempt's final reward (used when the agent returns None).
    """
    reward = reward_value(value)
    attempt = current_attempt()
    if attempt is None:
        _warn_outside("emit_reward")
        return
    attrs: dict[str, Any] = {ATTR_STEP_KIND: STEP_REWARD, ATTR_REWARD_VALUE: reward}
    if name is not None:
        attrs[ATTR_REWARD_NAME] = name
    if attempt.agent_name is not None:
        attrs[ATTR_AGENT_NAME] = attempt.agent_name
    get_tracer().start_span(SPAN_FINAL_REWARD if final else SPAN_REWARD, attributes=attrs).end()


class SpanHandle:
    """The open span inside `with span(...) as s:`; attributes may be any JSON value."""

    def __init__(self, otel_span: trace.Span, json_keys: Sequence[str] = ()) -> None:
        self.otel = otel_span
        self._json_keys = list(json_keys)

    def set_attribute(self, key: str, value: Any) -> None:
        self.set_attributes({key: value})

    def set_attributes(self, attributes: dict[str, Any]) -> None:
        encoded = encode_attributes(attributes)
        # The span's list of JSON-encoded keys must cover every call, not just the last one.
        new_json = set(encoded.pop(ATTR_JSON_KEYS, ()))
        self._json_keys = [k for k in self._json_keys if k not in attributes] + sorted(new_json)
        encoded[ATTR_JSON_KEYS] = self._json_keys
        self.otel.set_attributes(encoded)

    def add_event(self, name: str, **attributes: Any) -> None:
        self.otel.add_event(name, encode_attributes(attributes))


class span:  # lower-case: used like a function, `with reinforge.span(...)` / `@reinforge.span(...)`
    """Trace one step of the agent: a context manager, or a decorator for sync and async functions.

    `kind="tool"` marks a tool call: if the body raises, the span gets error status and the
    `tool_error` AIR signal, and the exception propagates unchanged.
    """

    def __init__(self, name: str, kind: StepKind = "custom", **attributes: Any) -> None:
        if not name:
            raise InvalidRequestError("a span needs a non-empty name")
        if kind not in ("custom", "tool"):
            raise InvalidRequestError(f"span kind must be 'custom' or 'tool', got {kind!r}")
        self.name = name
        self.kind: StepKind = kind
        self.attributes = attributes
        self._open: list[tuple[ExitStack, trace.Span]] = []

    def _start(self) -> SpanHandle:
        attrs: dict[str, Any] = {ATTR_STEP_KIND: STEP_TOOL if self.kind == "tool" else STEP_CUSTOM}
        if self.kind == "tool":
            attrs[ATTR_TOOL_NAME] = self.name
        attempt = current_attempt()
        if attempt is not None and attempt.agent_name is not None:
            attrs[ATTR_AGENT_NAME] = attempt.agent_name
        attrs.update(self.attributes)
        encoded = encode_attributes(attrs)
        stack = ExitStack()
        otel_span = stack.enter_context(
            get_tracer().start_as_current_span(
                self.name,
                attributes=encoded,
                record_exception=False,
                set_status_on_exception=False,
            )
        )
        self._open.append((stack, otel_span))
        return SpanHandle(otel_span, encoded.get(ATTR_JSON_KEYS, ()))

    def _end(self, exc: BaseException | None) -> None:
        stack, otel_span = self._open.pop()
        # Cancellation and KeyboardInterrupt are not the step's failure; only real exceptions are.
        if isinstance(exc, Exception):
            otel_span.record_exception(exc)
            otel_span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))
            if self.kind == "tool":
                otel_span.set_attribute(ATTR_AIR_SIGNAL, AIR_TOOL_ERROR)
        stack.close()

    def __enter__(self) -> SpanHandle:
        return self._start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end(exc)

    async def __aenter__(self) -> SpanHandle:
        return self._start()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._end(exc)

    @overload
    def __call__(self, fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        # A fresh `span` per call, so concurrent calls of the decorated function don't share state.
        if inspect.iscoroutinefunction(fn):
            async_fn = cast(Callable[P, Awaitable[Any]], fn)

            @functools.wraps(fn)
            async def async_wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
                async with span(self.name, self.kind, **self.attributes):
                    return await async_fn(*args, **kwargs)

            return async_wrapper

        @functools.wraps(fn)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> Any:
            with span(self.name, self.kind, **self.attributes):
                return fn(*args, **kwargs)

        return wrapper
