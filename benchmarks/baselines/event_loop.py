"""Run a coroutine on uvloop when it is installed, as `reinforge store serve` and `reinforge runner` do.

The benchmarks serve reinforge's apps from their own processes; they should run on the same event
loop the shipped commands pick, or the numbers would describe a configuration nobody runs.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from reinforge._event_loop import run_on_fast_loop


def run(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    run_on_fast_loop(main)
