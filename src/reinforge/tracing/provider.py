"""The process-wide TracerProvider whose spans end up in the store.

reinforge's own API (`span`, `emit_reward`) always uses this provider. `install_global_tracer_provider`
also routes spans from other OpenTelemetry instrumentation (an agent framework's own tracing) to the
store: it installs this provider as the global one, or, when the application already installed an SDK
provider, adds reinforge's processor to that one.
"""

from __future__ import annotations

import threading

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from reinforge.semconv import trace_id_for
from reinforge.tracing.context import current_attempt
from reinforge.tracing.processor import AttemptSpanProcessor, SpanTranslator
from reinforge.types import new_span_id


class _AttemptTraceIds(RandomIdGenerator):
    """Root spans inside an attempt join the attempt's trace, the one the gateway's LLM spans use;
    span ids come from reinforge's per-process counter, so the store's span index appends."""

    def generate_span_id(self) -> int:
        return int(new_span_id(), 16)

    def generate_trace_id(self) -> int:
        attempt = current_attempt()
        if attempt is None:
            return super().generate_trace_id()
        return int(trace_id_for(attempt.attempt_id), 16)


_lock = threading.Lock()
_processor = AttemptSpanProcessor()
_provider = TracerProvider(
    resource=Resource.create({"service.name": "reinforge-agent"}),
    id_generator=_AttemptTraceIds(),
    shutdown_on_exit=False,
)
_provider.add_span_processor(_processor)
_tracer = _provider.get_tracer("reinforge")
_hooked: set[int] = set()


def get_tracer_provider() -> TracerProvider:
    return _provider


def get_tracer() -> trace.Tracer:
    return _tracer


def add_span_translator(translator: SpanTranslator) -> None:
    """Rewrite the spans of framework-instrumented attempts before they are stored (idempotent);
    applies to spans of the global provider too, whichever provider that is."""
    _processor.add_translator(translator)


def install_global_tracer_provider() -> None:
    """Make spans from any OpenTelemetry instrumentation in this process reach the store (idempotent)."""
    with _lock:
        current = trace.get_tracer_provider()
        if current is _provider or id(current) in _hooked:
            return
        if isinstance(current, TracerProvider):
            current.add_span_processor(_processor)
            _hooked.add(id(current))
        else:
            trace.set_tracer_provider(_provider)
