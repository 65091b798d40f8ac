"""One way to run reinforge's long-lived commands: on uvloop when it is installed."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def run_on_fast_loop(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run `main()` to completion on uvloop (faster sockets and callbacks), else on asyncio's loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main())
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main())
