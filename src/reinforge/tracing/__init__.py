"""Tracing for in-process agents: rewards and steps recorded as OpenTelemetry spans in the store.

    import reinforge

    @reinforge.span("search", kind="tool")
    def search(q: str) -> list[str]: ...

    reinforge.emit_reward(0.5, name="found_answer")

The runner sets the current attempt (`attempt_scope`) and owns the `SpanWriter` that batches spans
into the store; agents only call `span` and `emit_reward`.
"""

from reinforge.tracing.api import SpanHandle, emit_reward, reward_value, span
from reinforge.tracing.buffer import AttemptSpanBuffer
from reinforge.tracing.context import AttemptContext, SpanSink, attempt_scope, current_attempt
from reinforge.tracing.processor import AttemptSpanProcessor, SpanTranslator, to_reinforge_span
from reinforge.tracing.provider import (
    add_span_translator,
    get_tracer,
    get_tracer_provider,
    install_global_tracer_provider,
)
from reinforge.tracing.threads import instrument_threads
from reinforge.tracing.writer import SpanWriter

__all__ = [
    "AttemptContext",
    "AttemptSpanBuffer",
    "AttemptSpanProcessor",
    "SpanHandle",
    "SpanSink",
    "SpanTranslator",
    "SpanWriter",
    "add_span_translator",
    "attempt_scope",
    "current_attempt",
    "emit_reward",
    "get_tracer",
    "get_tracer_provider",
    "install_global_tracer_provider",
    "instrument_threads",
    "reward_value",
    "span",
    "to_reinforge_span",
]
