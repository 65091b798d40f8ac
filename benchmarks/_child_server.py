"""Serving an app from a benchmark's child process, the way reinforge itself serves it."""

from __future__ import annotations

import asyncio
import sys
import threading
from typing import Any

import uvicorn

from reinforge._heap import freeze_startup_heap
from reinforge.net.route_protocol import RouteTableProtocol


async def serve_until_stdin_closes(app: Any, port: int) -> None:
    """Serve `app` on 127.0.0.1:`port` with `RouteTableProtocol` (as `BackgroundServer`, so the
    trainer, serves it) until the parent process closes this process's stdin: the stop signal.

    What exists before serving is frozen out of the garbage collector's full collections, as the
    trainer and `reinforge store serve` do with theirs.
    """
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, http=RouteTableProtocol
    )
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()

    def stop_when_stdin_closes() -> None:
        sys.stdin.read()
        loop.call_soon_threadsafe(setattr, server, "should_exit", True)

    threading.Thread(target=stop_when_stdin_closes, daemon=True).start()
    freeze_startup_heap()
    await server.serve()
