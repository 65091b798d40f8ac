"""Run an ASGI app with uvicorn in a background thread, on 127.0.0.1 and a free port.

The trainer, the tests and the benchmarks all need "start this app, give me its URL, stop it later";
this is that, once. Apps that offer a route table (`reinforge.net.routes`) have it served by
`RouteTableProtocol`, as the trainer serves them.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from reinforge.net.route_protocol import RouteTableProtocol


class BackgroundServer:
    """Serve `app` until `stop()`; usable as a context manager.

    >>> with BackgroundServer(app) as server:
    ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app: Any, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self.host = host
        self.port: int = self._sock.getsockname()[1]
        config = uvicorn.Config(
            app, log_level=log_level, lifespan="on", access_log=False, http=RouteTableProtocol
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._sock]}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server thread exited during start-up; see the log above")
            if time.monotonic() > deadline:
                raise TimeoutError(f"server on {self.url} did not start within {timeout}s")
            time.sleep(0.01)
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout)
        self._sock.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
