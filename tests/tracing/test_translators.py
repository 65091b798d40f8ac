"""Span translators: they rewrite the spans of attempts that record framework telemetry, leave other
attempts' spans as they were, and a failing one never breaks the code whose span ended."""

from __future__ import annotations

import logging
import threading

import pytest
from opentelemetry.sdk.trace import TracerProvider

from reinforge.tracing import AttemptContext, AttemptSpanProcessor, attempt_scope
from reinforge.types import Span


class Kept:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.spans: list[Span] = []

    def submit(self, span: Span) -> None:
        with self._lock:
            self.spans.append(span)


def _mark(span: Span) -> Span:
    return span.model_copy(update={"attributes": {**span.attributes, "translated": True}})


def _broken(span: Span) -> Span:
    raise RuntimeError("translator bug")


def test_translators_apply_only_to_framework_instrumented_attempts(caplog: pytest.LogCaptureFixture) -> None:
    processor = AttemptSpanProcessor()
    processor.add_translator(_mark)
    processor.add_translator(_mark)  # idempotent
    processor.add_translator(_broken)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("test")

    on, off = Kept(), Kept()
    with caplog.at_level(logging.ERROR, logger="reinforge.tracing.processor"):
        with attempt_scope(AttemptContext("r1", "a1", sink=on, framework_telemetry=True)):
            tracer.start_span("execute_tool calc", attributes={"x": 1}).end()
        with attempt_scope(AttemptContext("r2", "a2", sink=off)):
            tracer.start_span("execute_tool calc").end()

    (span,) = on.spans
    assert (span.name, span.attributes["x"], span.attributes["translated"]) == ("execute_tool calc", 1, True)
    assert "translated" not in off.spans[0].attributes
    # The broken translator was logged and skipped; the span went on, translated by the others.
    assert "span translator" in caplog.text and "translator bug" in caplog.text
