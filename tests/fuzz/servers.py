"""The real store server (SQLite in a temporary folder) and the real gateway on 127.0.0.1, as the
fuzz tests hit them.

The fuzzer asks for what the schema allows, waits of up to a minute included; `QuickWaits` caps
the store's own blocking waits so that such a request answers at once (everything else is the real
SQLite store behind the real app, served by the route-table protocol the trainer uses).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.access import attempt_token
from reinforge.gateway.app import create_gateway_app
from reinforge.inference.scripted import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.factory import open_store
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.store.protocol import Store
from reinforge.types import LeasedRollout, Rollout, RolloutMode, RolloutSpec

TOKEN = "fuzz-store-token"
MAX_WAIT_S = 0.05


class QuickWaits:
    """A store whose lease and wait calls block at most `MAX_WAIT_S`; the rest is delegated."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    async def lease_rollouts(
        self,
        runner_id: str,
        max_rollouts: int = 1,
        lease_seconds: float = 60.0,
        wait_seconds: float = 0.0,
        mode: RolloutMode | None = None,
    ) -> list[LeasedRollout]:
        return await self._store.lease_rollouts(
            runner_id, max_rollouts, lease_seconds, wait_seconds=min(wait_seconds, MAX_WAIT_S), mode=mode
        )

    async def wait_for_rollouts(self, rollout_ids: Sequence[str], timeout_seconds: float) -> list[Rollout]:
        return await self._store.wait_for_rollouts(rollout_ids, min(timeout_seconds, MAX_WAIT_S))


@contextmanager
def store_server(folder: Path) -> Iterator[BackgroundServer]:
    """The store app over SQLite in `folder`, served on a free port of 127.0.0.1."""

    async def open_backend() -> Store:
        return QuickWaits(await open_store(f"sqlite:///{folder / 'store.db'}"))  # type: ignore[return-value]

    with BackgroundServer(create_store_app(open_backend, TOKEN)) as server:
        yield server


GATEWAY_SECRET = "fuzz-gateway-secret-" + "f" * 16


@dataclass
class GatewayUnderTest:
    server: BackgroundServer
    attempt_id: str
    """A running attempt, leased for an hour."""
    key: str
    """Its token: the API key its agent would be given."""


@contextmanager
def gateway_server(tokenizer: Any) -> Iterator[GatewayUnderTest]:
    """The gateway alone on 127.0.0.1 (served by the route-table protocol, as the trainer serves it)
    over a memory store holding one running attempt, with the scripted backend."""
    store = MemoryStore()
    backend = ScriptedBackend(
        tokenizer, ["The answer is 4.", '<tool_call>{"name":"f","arguments":{}}</tool_call>']
    )

    async def lease() -> LeasedRollout:
        await store.enqueue_rollouts([RolloutSpec(task={"q": "fuzz"})])
        [leased] = await store.lease_rollouts("fuzz-runner", 1, 3600.0)
        return leased

    attempt_id = asyncio.run(lease()).attempt.attempt_id
    with BackgroundServer(create_gateway_app(store, backend, GATEWAY_SECRET)) as server:
        yield GatewayUnderTest(server, attempt_id, attempt_token(GATEWAY_SECRET, attempt_id))
