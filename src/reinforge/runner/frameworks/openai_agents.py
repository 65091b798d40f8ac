"""OpenAI Agents SDK: its agent spans become agent steps and its function spans tool steps.

The SDK traces through its own processors, not OpenTelemetry. Its default processor uploads every
trace to api.openai.com, which a training run must never do (and has no key for), so installing
reinforge's processor also removes that uploader while keeping any processor the user added.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from reinforge.runner.frameworks.steps import Step, recording_attempt, start_agent, start_tool

log = logging.getLogger(__name__)

FRAMEWORK = "openai_agents"

_lock = threading.Lock()
_installed = False


def _error_text(error: Any) -> str | None:
    """The SDK's span error (`{"message", "data"}`) as one line, or None when the span succeeded."""
    if not error:
        return None
    if not isinstance(error, dict):
        return str(error)
    message = str(error.get("message") or "error")
    data = error.get("data")
    detail = data.get("error") if isinstance(data, dict) else None
    return f"{message}: {detail}" if detail else message


class _Processor:
    """The processor's logic; `install` combines it with the SDK's `TracingProcessor`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[str, Step] = {}
        """SDK span id -> the step it started."""
        self._nearest: dict[str, Step] = {}
        """SDK span id -> the innermost step at or above it (turn spans sit between agent and tools)."""

    def on_trace_start(self, trace: Any) -> None:
        return None

    def on_trace_end(self, trace: Any) -> None:
        return None

    def on_span_start(self, span: Any) -> None:
        if recording_attempt() is None:
            return
        data = span.span_data
        kind = getattr(data, "type", None)
        with self._lock:
            parent = self._nearest.get(span.parent_id) if span.parent_id else None
        step: Step | None = None
        if kind == "agent":
            step = start_agent(str(data.name), FRAMEWORK, parent)
        elif kind == "function":
            step = start_tool(str(data.name), FRAMEWORK, parent)
        with self._lock:
            if step is not None:
                self._steps[span.span_id] = step
            nearest = step if step is not None else parent
            if nearest is not None:
                self._nearest[span.span_id] = nearest

    def on_span_end(self, span: Any) -> None:
        with self._lock:
            self._nearest.pop(span.span_id, None)
            step = self._steps.pop(span.span_id, None)
        if step is not None:
            step.end(_error_text(span.error))

    def shutdown(self) -> None:
        return None

    def force_flush(self) -> None:
        return None


def _uploads(processor: Any, processors: Any) -> bool:
    """Whether `processor` is the SDK's uploader to api.openai.com."""
    exporter = getattr(processor, "_exporter", None)
    return isinstance(processor, processors.BatchTraceProcessor) and isinstance(
        exporter, processors.BackendSpanExporter
    )


def install() -> None:
    """Add reinforge's processor and drop the uploading one, once per process."""
    global _installed
    with _lock:
        if _installed:
            return
        import agents
        from agents.tracing import get_trace_provider
        from agents.tracing import processors as sdk_processors

        processor = type("ReinforgeTracingProcessor", (_Processor, agents.TracingProcessor), {})()
        # The SDK offers no way to list its processors; a provider without the known attribute gets
        # reinforge's processor alone, so nothing can upload.
        current = getattr(getattr(get_trace_provider(), "_multi_processor", None), "_processors", None)
        kept = [p for p in current or () if not _uploads(p, sdk_processors)]
        if current is None:
            log.warning("unknown Agents SDK trace provider; its trace processors are replaced")
        agents.set_trace_processors([*kept, processor])
        _installed = True
