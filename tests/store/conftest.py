"""The `store` fixture: every conformance test runs once per backend in STORE_FACTORIES.

To add a backend, add one entry: an async context manager factory taking the test's tmp_path and
yielding a ready Store (helper 2 adds "http": an HttpStoreClient against the real server on SQLite).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path

import psycopg
import pytest

from reinforge.store import MemoryStore, SqlStore, Store, rules

PG_URL = "postgresql://root@127.0.0.1:5432/test"

WAKE_LIMIT = 2.0
"""How soon an event-driven wait must wake (seconds). Generous, for a loaded CI machine; the
safety re-check is pushed far past it below, so meeting it proves the wake-up was an event."""


@pytest.fixture(autouse=True)
def _no_safety_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rules, "RECHECK_SECONDS", 60.0)


def postgres_available() -> bool:
    try:
        with psycopg.connect(PG_URL, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@asynccontextmanager
async def pg_schema() -> AsyncIterator[str]:
    """A fresh PostgreSQL schema for one test, dropped afterwards (the database keeps state)."""
    if not postgres_available():
        pytest.skip(f"PostgreSQL is not reachable at {PG_URL}")
    name = f"rf_test_{uuid.uuid4().hex[:12]}"
    try:
        yield name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@asynccontextmanager
async def memory_store(tmp_path: Path) -> AsyncIterator[Store]:
    store = MemoryStore()
    yield store
    await store.close()


@asynccontextmanager
async def sqlite_store(tmp_path: Path) -> AsyncIterator[Store]:
    store = await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        yield store
    finally:
        await store.close()


@asynccontextmanager
async def postgres_store(tmp_path: Path) -> AsyncIterator[Store]:
    async with pg_schema() as schema:
        store = await SqlStore.open(PG_URL, schema=schema, workers=4)
        try:
            yield store
        finally:
            await store.close()


@asynccontextmanager
async def http_store(tmp_path: Path) -> AsyncIterator[Store]:
    """The real store server (uvicorn, 127.0.0.1) on SQLite, reached through HttpStoreClient."""
    from reinforge.net.background import BackgroundServer
    from reinforge.store.http.client import HttpStoreClient
    from reinforge.store.http.server import create_store_app

    async def open_backend() -> Store:  # opened in the server thread's own event loop
        return await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")

    token = uuid.uuid4().hex
    server = BackgroundServer(create_store_app(open_backend, token))
    await asyncio.to_thread(server.start)
    client = HttpStoreClient(server.url, token)
    try:
        yield client
    finally:
        await client.close()
        await asyncio.to_thread(server.stop)


STORE_FACTORIES: dict[str, Callable[[Path], AbstractAsyncContextManager[Store]]] = {
    "memory": memory_store,
    "sqlite": sqlite_store,
    "postgres": postgres_store,
    "http": http_store,
}

_MARKS = {"postgres": [pytest.mark.postgres]}


@pytest.fixture(params=[pytest.param(name, marks=_MARKS.get(name, [])) for name in STORE_FACTORIES])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    async with STORE_FACTORIES[request.param](tmp_path) as s:
        yield s
