"""Agent frameworks' own telemetry as reinforge steps, with no change to the agent.

`instrument_frameworks()` turns on one hook per installed framework: tool runs become tool steps
(a failed one carries the `tool_error` AIR signal) and agent/node runs become agent steps, which
credit uses to name the LLM calls made inside them. Only a framework the process has already
imported is hooked (an agent imports its framework before it runs, and the runner asks again as each
attempt starts), so hooking never pays for importing a framework the agent does not use. Hooks
record only inside an attempt whose `framework_telemetry` is on (the runner's
`instrument_frameworks=True`), so they cost nothing elsewhere.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass

from reinforge.runner.frameworks import genai_otel, langchain, openai_agents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Framework:
    name: str
    module: str
    """The top-level module the hook imports."""
    distribution: str
    """The package that must provide it (`agents` is a common name for a user's own package)."""
    install: Callable[[], None]


_FRAMEWORKS = (
    _Framework("langchain", "langchain_core", "langchain-core", langchain.install),
    _Framework("openai_agents", "agents", "openai-agents", openai_agents.install),
)
_lock = threading.Lock()
_hooked: set[str] = set()


def _installed(framework: _Framework) -> bool:
    try:
        importlib.metadata.distribution(framework.distribution)
        return importlib.util.find_spec(framework.module) is not None
    except (importlib.metadata.PackageNotFoundError, ImportError, ValueError):
        return False


def instrument_frameworks() -> list[str]:
    """Turn on the hooks of every imported framework (idempotent, cheap); the frameworks now hooked.

    AutoGen and the Anthropic SDK need no import: their OpenTelemetry spans are translated
    (`genai_otel`). A hook that fails to install is logged and skipped; the agent still runs.
    """
    pending = [f for f in _FRAMEWORKS if f.name not in _hooked and f.module in sys.modules]
    if not pending and genai_otel.FRAMEWORK in _hooked:
        return sorted(_hooked)  # the per-attempt call's usual path: no lock, no lookups
    with _lock:
        if genai_otel.FRAMEWORK not in _hooked:
            genai_otel.install()
            _hooked.add(genai_otel.FRAMEWORK)
        for framework in pending:
            if framework.name in _hooked or not _installed(framework):
                continue
            try:
                framework.install()
            except Exception:
                log.warning(
                    "could not hook %s's telemetry; its steps are not recorded", framework.name, exc_info=True
                )
                continue
            _hooked.add(framework.name)
        return sorted(_hooked)


__all__ = ["instrument_frameworks"]
