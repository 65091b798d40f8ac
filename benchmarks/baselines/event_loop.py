"""Run a coroutine on uvloop when it is installed, as `reinforge store serve` does.

The benchmarks serve reinforge's apps from their own processes; they should run on the same event
loop the shipped command picks, or the numbers would describe a configuration nobody runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    try:
        import uvloop
    except ImportError:
        asyncio.run(main())
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
