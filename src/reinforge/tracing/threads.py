"""Carry the attempt into threads the agent starts.

asyncio tasks copy `contextvars` by themselves, and `asyncio.to_thread` does too, but a plain
`threading.Thread`, `ThreadPoolExecutor.submit` and `loop.run_in_executor` start with an empty
context, so a reward emitted there would belong to no attempt. `instrument_threads()` patches those
entry points to run the new work in a copy of the starter's context (as `asyncio.to_thread` does).
A plain thread is given the context only when it is started inside an attempt; a thread started
inside an attempt belongs to that attempt for its whole life.
"""

from __future__ import annotations

import contextvars
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from reinforge.tracing.context import current_attempt

_lock = threading.Lock()
_installed = False
_CTX_ATTR = "_reinforge_context"


def instrument_threads() -> None:
    """Patch threading.Thread and ThreadPoolExecutor once per process (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _installed = True

        original_start = threading.Thread.start
        # _bootstrap_inner wraps run() for subclasses that override run() too; fall back to run().
        inner_name = "_bootstrap_inner" if hasattr(threading.Thread, "_bootstrap_inner") else "run"
        original_inner: Callable[[threading.Thread], None] = getattr(threading.Thread, inner_name)

        def start(self: threading.Thread) -> None:
            if current_attempt() is not None:
                setattr(self, _CTX_ATTR, contextvars.copy_context())
            original_start(self)

        def inner(self: threading.Thread) -> None:
            ctx: contextvars.Context | None = self.__dict__.pop(_CTX_ATTR, None)
            if ctx is None:
                original_inner(self)
            else:
                ctx.run(original_inner, self)

        original_submit = ThreadPoolExecutor.submit

        def submit(
            self: ThreadPoolExecutor, fn: Callable[..., Any], /, *args: Any, **kwargs: Any
        ) -> Future[Any]:
            # Always the submitter's context, attempt or not: a pool's worker thread may have been
            # started inside an attempt, and later work must not inherit that attempt from it.
            return original_submit(self, contextvars.copy_context().run, fn, *args, **kwargs)

        threading.Thread.start = start  # type: ignore[method-assign]
        setattr(threading.Thread, inner_name, inner)
        setattr(ThreadPoolExecutor, "submit", submit)  # noqa: B010 - a signature mypy cannot express
