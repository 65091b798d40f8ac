"""The served stack: the store server's app with the gateway mounted at `GATEWAY_MOUNT`, over one
store and one backend; and that app served on a background thread (`ServedStack`).

The trainer (`training/rollout_stack.py`), the SFT recording (`training/collect.py`) and `reinforge
store serve` (`stack/cli.py`) all serve this one app. Runners finish attempts through the gateway,
and agents send their LLM calls, rewards and traces there, so a store served without one would lease
work that never finishes.
"""

from __future__ import annotations

import asyncio
import os
import secrets

from fastapi import FastAPI

from reinforge.gateway.app import Gateway, create_gateway_app
from reinforge.inference.contract import Backend
from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import DEFAULT_MAX_BODY_BYTES, create_store_app
from reinforge.store.protocol import Store
from reinforge.types import LeasedRollout

GATEWAY_MOUNT = "/gateway"
"""Where the gateway is mounted on the store server: agents' base URL is `<store>/gateway/...`."""


class StackApp:
    """The store app with the gateway mounted beside it, sharing `store`.

    The gateway learns of each attempt leased through the store's lease route (runner processes) or
    from a runner in this process (`leased`), instead of asking the store on the attempt's first call.
    Mounted apps get no lifespan events: the gateway binds to the serving loop on first use.
    """

    def __init__(
        self,
        store: Store,
        backend: Backend,
        *,
        store_token: str | None = None,
        gateway_secret: str | None = None,
        run_dir: str | os.PathLike[str] | None = None,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.store_token = store_token or secrets.token_urlsafe(24)
        """None given: one only this process knows."""
        self.gateway_secret = gateway_secret or secrets.token_urlsafe(24)
        gateway_app = create_gateway_app(store, backend, self.gateway_secret)
        self.gateway: Gateway = gateway_app.state.gateway
        self.app: FastAPI = create_store_app(
            store, self.store_token, max_body_bytes=max_body_bytes, on_lease=self.leased, run_dir=run_dir
        )
        self.app.mount(GATEWAY_MOUNT, gateway_app)

    def leased(self, leased: list[LeasedRollout]) -> None:
        self.gateway.attempts.remember_running(lr.attempt for lr in leased)
        self.gateway.samplings.remember(lr.rollout for lr in leased)

    def close_dashboard(self) -> None:
        """End open dashboard event streams now (a browser's must not hold a shutdown)."""
        self.app.state.dashboard.close()


class ServedStack:
    """A `StackApp` on a background server: `await start()`, its URLs, `await stop()`."""

    def __init__(self, stack: StackApp, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.stack = stack
        self.server = BackgroundServer(stack.app, host=host, port=port)

    @property
    def gateway(self) -> Gateway:
        return self.stack.gateway

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def gateway_url(self) -> str:
        return self.server.url + GATEWAY_MOUNT

    @property
    def dashboard_url(self) -> str:
        return f"{self.server.url}/dashboard#token={self.stack.store_token}"

    async def start(self) -> ServedStack:
        await asyncio.to_thread(self.server.start)
        return self

    async def stop(self) -> None:
        """The gateway's last spans into the store, then the server (stopped even when the flush
        fails; the flush's error is raised after)."""
        try:
            await self.gateway.flush()
        finally:
            self.stack.close_dashboard()
            await asyncio.to_thread(self.server.stop)
