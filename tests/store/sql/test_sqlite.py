"""SQLite specifics: WAL, durability across a killed process, a nested run folder, write order."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import Connection

from reinforge.errors import InvalidRequestError
from reinforge.store import SqlStore
from reinforge.store.sql import database as sql_database
from reinforge.store.sql.database import SqliteDatabase
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutSpec, RolloutStatus, Span, SpanQuery

from ..durability import assert_acked_spans_present, write_until_killed


async def test_file_is_created_in_wal_mode_in_a_new_folder(tmp_path: Path) -> None:
    path = tmp_path / "run" / "nested" / "store.db"
    store = await SqlStore.open(f"sqlite:///{path}")
    try:
        await store.enqueue_rollouts([RolloutSpec(rollout_id="x")])
    finally:
        await store.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA page_size").fetchone()[0] == 16384
        assert conn.execute("SELECT rollout_id, status FROM rollouts").fetchall() == [("x", "queued")]


async def test_data_survives_reopening(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    store = await SqlStore.open(url, synchronous="FULL")
    await store.enqueue_rollouts([RolloutSpec(rollout_id="keep", task={"a": 1})])
    await store.put_resources({"p": "x"})
    await store.close()
    store = await SqlStore.open(url)
    try:
        assert (await store.get_rollout("keep")).task == {"a": 1}
        assert (await store.get_resources()).resources == {"p": "x"}
    finally:
        await store.close()


async def test_acknowledged_span_batches_survive_sigkill(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    acked = write_until_killed(url, None, acks_wanted=40)
    store = await SqlStore.open(url)
    try:
        await assert_acked_spans_present(store, acked)
    finally:
        await store.close()


async def test_bad_urls_and_options_are_rejected(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError):
        await SqlStore.open("mysql://x/y")
    with pytest.raises(InvalidRequestError):
        await SqlStore.open(f"sqlite:///{tmp_path / 's.db'}", synchronous="OFF")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        await SqlStore.open("postgresql://root@127.0.0.1/test", schema="Bad-Name")


async def test_small_writes_overtake_a_span_batch_queued_with_them(tmp_path: Path) -> None:
    """A lease queued in the same loop turn as a span batch gets its answer before the batch runs;
    the batch waits one turn only, even when small writes keep coming."""
    db = SqliteDatabase(str(tmp_path / "order.db"), "NORMAL")
    await db.start()
    ran: list[str] = []

    def job(name: str) -> Callable[[Connection], str]:
        def fn(conn: Connection) -> str:
            ran.append(name)
            return str(conn.exec_driver_sql("SELECT 'ok'").scalar())

        return fn

    async def small_then_another() -> list[str]:
        first = await db.write(job("small-1"))
        seen = list(ran)  # what had run when the small write's caller resumed
        await db.write(job("small-2"))  # arrives while the batch waits: it must not delay the batch again
        return [first, *seen]

    try:
        bulk, seen = await asyncio.gather(db.write_bulk(job("bulk")), small_then_another())
        assert bulk == "ok"
        assert seen == ["ok", "small-1"]
        assert ran == ["small-1", "small-2", "bulk"]
        # Alone, a batch runs on the turn it was queued.
        ran.clear()
        assert await db.write_bulk(job("bulk-alone")) == "ok"
        assert ran == ["bulk-alone"]
    finally:
        await db.close()


async def test_wal_starts_over_under_a_steady_stream_of_commits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Commits back to back never leave SQLite a moment to start the WAL over by itself; the
    checkpointer makes one, so the WAL stays far smaller than the data written through it."""
    monkeypatch.setattr(sql_database, "_WAL_RESTART_BYTES", 512 * 1024)
    monkeypatch.setattr(sql_database, "_CATCH_UP_BYTES", 8 * 1024 * 1024)
    monkeypatch.setattr(sql_database, "_CHECKPOINT_SECONDS", 0.005)
    monkeypatch.setattr(sql_database, "_QUICK_SYNC_SECONDS", 60.0)  # however slowly this disk syncs
    path = tmp_path / "store.db"
    wal = Path(f"{path}-wal")
    store = await SqlStore.open(f"sqlite:///{path}")
    attributes = {"token_ids": list(range(2000))}  # ~10 KB of JSON per span
    largest = 0
    salts: set[bytes] = set()  # the WAL header's salts change each time the WAL starts over
    try:
        for batch in range(300):  # ~60 MB of spans in ~200 KB commits, one after the other
            spans = [
                Span(rollout_id="r", attempt_id="a", name="llm", attributes=attributes) for _ in range(20)
            ]
            assert await store.add_spans(spans) == 20
            if batch % 10 == 0:
                largest = max(largest, wal.stat().st_size)
                with wal.open("rb") as f:
                    salts.add(f.read(24)[16:24])
        page = await store.query_spans(SpanQuery(limit=1))
        assert page.total == 300 * 20
        assert page.items[0].attributes == attributes
    finally:
        await store.close()
    assert len(salts) >= 3
    # Without starting over, the WAL would hold every commit: about 100 MB.
    assert 0 < largest < 48 * 1024 * 1024


async def test_a_waiter_reads_once_for_a_batch_finished_one_by_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        rollouts = await store.enqueue_rollouts([RolloutSpec(task={"i": i}) for i in range(10)])
        others = await store.enqueue_rollouts([RolloutSpec(task={"other": True})])
        leased = {lr.rollout.rollout_id: lr for lr in await store.lease_rollouts("r", 11, 60.0)}
        reads: list[str] = []
        real_write = store._write

        async def counting(fn: Callable[..., object]) -> object:
            reads.append(fn.__qualname__)
            return await real_write(fn)

        monkeypatch.setattr(store, "_write", counting)
        ids = [r.rollout_id for r in rollouts]
        waiter = asyncio.create_task(store.wait_for_rollouts(ids, 30.0))
        await asyncio.sleep(0.05)
        # Someone else's rollout finishing wakes the waiter, which sees it is not one of its own.
        done = AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
        await store.finish_attempt(leased[others[0].rollout_id].attempt.attempt_id, done)
        for rollout_id in ids[:-1]:
            await store.finish_attempt(leased[rollout_id].attempt.attempt_id, done)
            await asyncio.sleep(0)  # a commit each, and a wake-up each
        await store.cancel_rollouts(ids[-1:])  # the last one ends another way
        final = await asyncio.wait_for(waiter, 10.0)
        assert [r.rollout_id for r in final] == ids
        assert [r.status for r in final] == [RolloutStatus.succeeded] * 9 + [RolloutStatus.cancelled]
        # One read before sleeping and one once all ten were reported final, not one per commit.
        assert sum(1 for name in reads if name.startswith("SqlStore.wait_for_rollouts")) == 2
    finally:
        await store.close()
