"""open_store picks the backend from the URL."""

from __future__ import annotations

from pathlib import Path

import pytest

from reinforge.errors import InvalidRequestError, StoreUnavailableError
from reinforge.store import MemoryStore, SqlStore, Store, open_store
from reinforge.types import RolloutSpec

from .conftest import PG_URL, pg_schema


async def test_memory_and_sqlite_urls(tmp_path: Path) -> None:
    mem = await open_store("memory://")
    assert isinstance(mem, MemoryStore) and isinstance(mem, Store)
    sql = await open_store(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        assert isinstance(sql, SqlStore) and sql.dialect == "sqlite"
        assert (await sql.enqueue_rollouts([RolloutSpec(rollout_id="a")]))[0].rollout_id == "a"
    finally:
        await sql.close()


@pytest.mark.postgres
async def test_postgres_url_with_schema() -> None:
    async with pg_schema() as schema:
        store = await open_store(f"{PG_URL}?schema={schema}")
        try:
            assert isinstance(store, SqlStore) and store.dialect == "postgresql"
            await store.enqueue_rollouts([RolloutSpec(rollout_id="a")])
            assert (await store.counters()).rollouts_by_status
        finally:
            await store.close()


async def test_unknown_urls_are_rejected_with_the_forms_we_accept() -> None:
    for url in ("redis://x", "store.db", ""):
        with pytest.raises(InvalidRequestError, match="sqlite:///"):
            await open_store(url)


async def test_an_unreachable_database_is_a_clear_unavailable_error(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailableError):
        await open_store("postgresql://root@127.0.0.1:1/test")
    (tmp_path / "dir.db").mkdir()
    with pytest.raises(StoreUnavailableError):
        await open_store(f"sqlite:///{tmp_path / 'dir.db'}")
