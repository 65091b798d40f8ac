"""Fixtures: a real store server (uvicorn on 127.0.0.1, a free port) and clients for it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from reinforge.net.background import BackgroundServer
from reinforge.store.http.client import HttpStoreClient
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.store.protocol import Store

TOKEN = "test-token-" + "x" * 20
PG_URL = "postgresql://root@127.0.0.1:5432/test"


async def _memory() -> Store:
    return MemoryStore()


@pytest.fixture
def server() -> Iterator[BackgroundServer]:
    """A store server on a MemoryStore, small body limit so oversize tests stay cheap."""
    app = create_store_app(_memory, TOKEN, max_body_bytes=256 * 1024)
    with BackgroundServer(app) as srv:
        yield srv


@pytest.fixture
def sqlite_server(tmp_path: Path) -> Iterator[BackgroundServer]:
    from reinforge.store.factory import open_store

    async def factory() -> Store:
        return await open_store(f"sqlite:///{tmp_path / 'store.db'}")

    with BackgroundServer(create_store_app(factory, TOKEN)) as srv:
        yield srv


@pytest.fixture
async def client(server: BackgroundServer) -> AsyncIterator[HttpStoreClient]:
    store = HttpStoreClient(server.url, TOKEN)
    yield store
    await store.close()


@pytest.fixture
async def http(server: BackgroundServer) -> AsyncIterator[httpx.AsyncClient]:
    """A raw HTTP client with the right token, for requests the typed client would never send."""
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as c:
        yield c


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL store URL in a fresh schema of database `test`, dropped afterwards."""
    import psycopg

    try:
        psycopg.connect(PG_URL, connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        pytest.skip(f"PostgreSQL not reachable at {PG_URL}: {exc}")
    schema = "rf_ss_" + uuid.uuid4().hex[:12]
    try:
        yield f"{PG_URL}?schema={schema}"
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
