"""The `with worker:` protocol the engine and its child-process twin share: started on the way in,
stopped on the way out."""

from __future__ import annotations

from typing import Self


class StartStop:
    """A worker with `start()` and `stop()`; `with worker:` calls both."""

    def start(self) -> Self:
        raise NotImplementedError

    def stop(self, timeout: float = 30.0) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
