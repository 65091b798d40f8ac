"""SQLite's keyed span layout: ids and names stored once, bodies without the head their row holds,
and store files written with the text layout upgraded in place when opened."""

from __future__ import annotations

import random
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import create_engine

from reinforge import semconv
from reinforge.errors import ReinforgeError
from reinforge.store import SqlStore
from reinforge.store.span_records import SpanRecord, parse_span_batch
from reinforge.store.sql.schema import metadata
from reinforge.store.sql.span_codec import SpanBodyCodec, SpanIds, strip_head, with_head
from reinforge.types import (
    RolloutSpec,
    Span,
    SpanEvent,
    SpanKind,
    SpanQuery,
    SpanStatus,
    SpanStatusCode,
    new_span_id,
)

from .test_retention import _conversation, _read_all, _same

# The text layout as reinforge wrote it before the keyed one (SQLAlchemy's DDL for it, verbatim).
_TEXT_LAYOUT = """
CREATE TABLE spans (
    sequence INTEGER NOT NULL,
    span_id VARCHAR(16) NOT NULL,
    trace_id VARCHAR(32) NOT NULL,
    rollout_id VARCHAR(128) NOT NULL,
    attempt_id VARCHAR(128) NOT NULL,
    name VARCHAR(512) NOT NULL,
    body TEXT NOT NULL,
    PRIMARY KEY (sequence),
    UNIQUE (span_id)
);
CREATE INDEX ix_spans_rollout ON spans (rollout_id, sequence);
CREATE INDEX ix_spans_attempt ON spans (attempt_id, sequence);
CREATE INDEX ix_spans_trace ON spans (trace_id, sequence);
CREATE INDEX ix_spans_name ON spans (name, sequence);
"""


def _ids(span: Span) -> SpanIds:
    return SpanIds(span.span_id, span.trace_id, span.rollout_id, span.attempt_id, span.name)


def _odd_spans() -> list[Span]:
    """Spans whose ids and names need JSON escapes, with a parent, events and a status."""
    return [
        Span(
            rollout_id='r "quoted" \\ é 日本',
            attempt_id="a\u2028\u0001b",
            name="tool:calc/√",
            parent_id=new_span_id(),
            kind=SpanKind.client,
            end_time=2.5,
            attributes={"x": [1, 2.5, None, {"y": "z"}]},
            status=SpanStatus(code=SpanStatusCode.error, message="boom"),
            events=[SpanEvent(name="e", timestamp=1.0, attributes={"k": 1})],
        ),
        Span(rollout_id="r", attempt_id="r", name="r"),
    ]


@pytest.mark.parametrize("path", ["pydantic", "ingest"])
def test_a_body_without_its_head_rebuilds_the_same_span(path: str) -> None:
    spans = _odd_spans() + _conversation("rollout", random.Random(3), calls=2)
    if path == "pydantic":
        records = [SpanRecord.from_span(s) for s in spans]
    else:
        wire = (
            b'{"spans":[' + b",".join(s.model_dump_json(exclude={"sequence"}).encode() for s in spans) + b"]}"
        )
        parsed = parse_span_batch(wire, 100)
        assert parsed is not None
        records = parsed
    for span, record in zip(spans, records, strict=True):
        rest = strip_head(record.body, _ids(span))
        assert rest is not None and span.span_id not in rest and '"rollout_id"' not in rest
        assert Span.model_validate_json(with_head(rest, _ids(span))) == span


def test_a_head_that_does_not_match_its_row_is_kept() -> None:
    span = _odd_spans()[1]
    body = SpanRecord.from_span(span).body
    assert strip_head(body, _ids(span)._replace(name="other")) is None
    assert strip_head(body.replace('"parent_id":null', '"parent_id": null'), _ids(span)) is None
    codec = SpanBodyCodec()
    [stored], _ = codec.encode_batch([body], [_ids(span)._replace(rollout_id="x")])
    assert stored[0] == 0x02  # the whole body, readable without the row
    assert codec.decode(stored, lambda _: b"") == body


async def test_the_keyed_layout_keeps_each_id_once_and_answers_every_filter(tmp_path: Path) -> None:
    rng = random.Random(5)
    spans = [s for i in range(30) for s in _conversation(f"r{i}", rng)] + _odd_spans()
    path = tmp_path / "store.db"
    store = await SqlStore.open(f"sqlite:///{path}")
    try:
        assert await store.add_spans(spans[:50]) == 50
        assert await store.add_spans(spans) == len(spans) - 50  # repeats are skipped
        _same(await _read_all(store), spans)
        odd = spans[-2]
        queries: list[tuple[dict[str, Any], list[Span]]] = [
            ({"rollout_id": odd.rollout_id}, [odd]),
            ({"attempt_id": odd.attempt_id}, [odd]),
            ({"trace_id": odd.trace_id}, [odd]),
            ({"name": odd.name}, [odd]),
            ({"rollout_ids": ["r3", odd.rollout_id, "nobody"]}, [*spans[9:12], odd]),
            ({"attempt_id": spans[4].attempt_id, "name": semconv.SPAN_LLM_CALL}, spans[3:6]),
            ({"rollout_id": "nobody"}, []),
            ({"name": "r"}, [spans[-1]]),
        ]
        for query, want in queries:
            _same(await _read_all(store, **query), want)
        page = await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=5, offset=10))
        assert page.total == 90 and [s.span_id for s in page.items] == [s.span_id for s in spans[10:15]]
        everything = await store.query_spans(SpanQuery(limit=7))
        assert everything.total == len(spans) and everything.items[0].sequence == 1
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        keys = db.execute("SELECT count(*) FROM span_keys").fetchone()[0]
        formats = {row[0] for row in db.execute("SELECT substr(body, 1, 1) FROM spans")}
        plan = " ".join(
            row[3]
            for row in db.execute(
                "EXPLAIN QUERY PLAN SELECT sequence FROM spans WHERE rollout_key = "
                "(SELECT key FROM span_keys WHERE value = 'r1') ORDER BY sequence"
            )
        )
    # 30 rollouts, their 30 attempts (each its own trace), one LLM-call name; the odd spans' four
    # strings and two traces (the second uses "r" as its rollout, attempt and name: one key).
    assert keys == 30 + 30 + 1 + 6
    assert formats == {b"\x03"}
    assert "ix_spans_rollout" in plan


def _text_layout_store(path: Path, spans: list[Span], compressed: list[Span]) -> None:
    """A store file as the text layout's reinforge left it: plain JSON bodies and 0x02 ones."""
    codec = SpanBodyCodec()
    bodies, dictionary = codec.encode_batch([SpanRecord.from_span(s).body for s in compressed])
    assert all(b[0] == 0x02 for b in bodies)
    engine = create_engine(f"sqlite:///{path}")
    metadata.create_all(engine)  # the other tables have not changed
    engine.dispose()
    with sqlite3.connect(path) as db:
        db.executescript(_TEXT_LAYOUT)
        # One rollout of them enqueued, so the upgrade keys its spans by its seq.
        db.execute(
            "INSERT INTO rollouts (rollout_id, status, mode, max_attempts, attempt_count, created_at, "
            "updated_at, task, metadata) VALUES ('zst3', 'queued', 'train', 1, 0, 1.0, 1.0, '{}', '{}')"
        )
        rows: list[tuple[str | bytes, Span]] = [(SpanRecord.from_span(s).body, s) for s in spans]
        rows += list(zip(bodies, compressed, strict=True))
        db.executemany(
            "INSERT INTO spans (span_id, trace_id, rollout_id, attempt_id, name, body) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            [(s.span_id, s.trace_id, s.rollout_id, s.attempt_id, s.name, body) for body, s in rows],
        )
        if dictionary is not None:
            db.execute("INSERT INTO span_dictionaries VALUES (?, ?)", dictionary)


async def test_a_text_layout_store_is_upgraded_when_opened(tmp_path: Path) -> None:
    rng = random.Random(11)
    plain = [s for i in range(3) for s in _conversation(f"old{i}", rng)] + _odd_spans()
    compressed = [s for i in range(20) for s in _conversation(f"zst{i}", rng)]
    new = _conversation("new", rng)
    path = tmp_path / "store.db"
    _text_layout_store(path, plain, compressed)
    old = plain + compressed

    store = await SqlStore.open(f"sqlite:///{path}")
    try:
        _same(await _read_all(store), old)
        _same(await _read_all(store, rollout_id="zst7"), compressed[21:24])
        _same(await _read_all(store, rollout_ids=["zst3", "old1"]), plain[3:6] + compressed[9:12])
        _same(await _read_all(store, attempt_id=plain[-2].attempt_id), [plain[-2]])
        assert [s.sequence for s in await _read_all(store)] == list(range(1, len(old) + 1))
        assert await store.add_spans([old[0], old[-1]]) == 0  # already there, under the old layout
        assert await store.add_spans(new) == 3
    finally:
        await store.close()
    store = await SqlStore.open(f"sqlite:///{path}")  # a second open finds nothing to upgrade
    try:
        read = await _read_all(store)
        _same(read, old + new)
        assert [s.sequence for s in read] == list(range(1, len(old) + 4))
        assert (await store.counters()).spans == len(old) + 3
    finally:
        await store.close()
    with sqlite3.connect(path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(spans)")]
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        kinds = dict(db.execute("SELECT typeof(body), count(*) FROM spans GROUP BY 1").fetchall())
        rollout_keys = dict(db.execute("SELECT rollout_key > 0, count(*) FROM spans GROUP BY 1").fetchall())
        indexes = {
            row[0]
            for row in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'spans'"
            )
        }
    assert columns == ["sequence", "span_id", "rollout_key", "attempt_key", "trace_key", "name_key", "body"]
    assert "spans_text_layout" not in tables
    assert kinds == {"text": len(plain), "blob": len(compressed) + 3}
    assert rollout_keys == {1: 3, 0: len(old)}  # zst3's spans by its seq, the others by span_keys
    assert indexes == {"ix_spans_rollout", "ix_spans_attempt", "ix_spans_trace", "sqlite_autoindex_spans_1"}


async def test_an_upgrade_that_fails_leaves_the_file_as_it_was(tmp_path: Path) -> None:
    rng = random.Random(12)
    spans = _conversation("old", rng)
    path = tmp_path / "store.db"
    _text_layout_store(path, spans, [])
    with sqlite3.connect(path) as db:  # something in the way of the keyed layout's tables
        db.execute("CREATE VIEW span_keys AS SELECT 1 AS key, 'x' AS value")
    with pytest.raises(ReinforgeError, match="could not upgrade this store's spans"):
        await SqlStore.open(f"sqlite:///{path}")
    with sqlite3.connect(path) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(spans)")]
        assert columns[:4] == ["sequence", "span_id", "trace_id", "rollout_id"]
        assert db.execute("SELECT count(*) FROM spans").fetchone()[0] == 3
        db.execute("DROP VIEW span_keys")
    store = await SqlStore.open(f"sqlite:///{path}")  # once out of the way, the upgrade goes through
    try:
        _same(await _read_all(store), spans)
    finally:
        await store.close()


async def test_spans_of_a_rollout_enqueued_midway_read_as_one_rollout(tmp_path: Path) -> None:
    """Spans stored before their rollout was enqueued are keyed by `span_keys`, the later ones by
    the rollout's seq: every read by rollout id finds both."""
    rng = random.Random(13)
    early, late, other = _conversation("mid", rng), _conversation("mid", rng), _conversation("known", rng)
    store = await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        await store.enqueue_rollouts([RolloutSpec(rollout_id="known")])
        assert await store.add_spans(early + other) == 6
        await store.enqueue_rollouts([RolloutSpec(rollout_id="mid")])
        assert await store.add_spans(late) == 3
        _same(await _read_all(store, rollout_id="mid"), early + late)
        _same(await _read_all(store, rollout_ids=["known", "mid"]), early + other + late)
        _same(await _read_all(store, trace_id=late[0].trace_id), late)
        _same(await _read_all(store), early + other + late)
        page = await store.query_spans(SpanQuery(rollout_id="mid", limit=4, offset=1))
        assert page.total == 6
        assert [s.span_id for s in page.items] == [s.span_id for s in early[1:] + late[:2]]
    finally:
        await store.close()
    with sqlite3.connect(tmp_path / "store.db") as db:
        plan = " ".join(
            row[3]
            for row in db.execute(
                "EXPLAIN QUERY PLAN SELECT sequence FROM spans WHERE (trace_key = 5 "
                "OR (trace_key IS NULL AND attempt_key = 5)) ORDER BY sequence"
            )
        )
    assert "ix_spans_trace" in plan and "ix_spans_attempt" in plan
