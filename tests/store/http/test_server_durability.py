"""Durability: what a real server process acknowledged survives SIGKILL (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

from reinforge.errors import ReinforgeError
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import RolloutQuery, RolloutSpec, Span, SpanQuery

from .served import ServedStore

BATCHES = 40
SPANS_PER_BATCH = 25


def _batch(b: int) -> list[Span]:
    return [
        Span(
            span_id=f"{b:08x}{i:08x}",
            rollout_id=f"r{b}",
            attempt_id=f"a{b}",
            name="reinforge.llm_call",
            attributes={"reinforge.llm.completion_token_ids": list(range(200)), "batch": b},
        )
        for i in range(SPANS_PER_BATCH)
    ]


async def _write_then_kill(served: ServedStore) -> tuple[int, int]:
    """Write batches until BATCHES are acknowledged, SIGKILL the server while still writing."""
    client = HttpStoreClient(served.url, served.token, connect_retries=0)
    await client.enqueue_rollouts([RolloutSpec(rollout_id=f"r{b}") for b in range(BATCHES)])
    acked = 0
    killed = asyncio.Event()

    async def writer() -> None:
        nonlocal acked
        b = 0
        while True:
            try:
                assert await client.add_spans(_batch(b)) == SPANS_PER_BATCH
            except ReinforgeError:
                assert killed.is_set()
                return
            acked = b + 1
            b += 1
            if acked == BATCHES:
                served.kill()  # the next batch is in flight or about to be
                killed.set()

    await asyncio.wait_for(writer(), 120)
    await client.close()
    return acked, served.process.returncode


async def _assert_all_there(served: ServedStore, acked: int) -> None:
    async with HttpStoreClient(served.url, served.token) as client:
        ids: set[str] = set()
        offset: int | None = 0
        while offset is not None:
            page = await client.query_spans(SpanQuery(limit=1000, offset=offset))
            ids |= {s.span_id for s in page.items}
            offset = page.next_offset
        missing = [s.span_id for b in range(acked) for s in _batch(b) if s.span_id not in ids]
        assert not missing, f"{len(missing)} acknowledged spans lost"
        rollouts = await client.query_rollouts(RolloutQuery(limit=1000))
        assert rollouts.total == BATCHES


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_acknowledged_batches_survive_sigkill(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest
) -> None:
    db = request.getfixturevalue("pg_url") if backend == "postgres" else None
    served = await asyncio.to_thread(ServedStore, tmp_path, db)
    try:
        acked, returncode = await _write_then_kill(served)
    finally:
        served.kill()
    assert returncode == -signal.SIGKILL
    assert acked == BATCHES

    restarted = await asyncio.to_thread(ServedStore, tmp_path, db)  # same run folder, same database
    try:
        await _assert_all_there(restarted, acked)
    finally:
        # SIGTERM is a graceful stop: uvicorn finishes, then re-raises the signal as the exit status.
        assert restarted.terminate() in (0, -signal.SIGTERM)
        assert not (tmp_path / "store.url").exists()
