"""SQLite's span table: spans point at their ids and name by integer key, each string stored once.

Why: a span's row held its rollout, attempt and trace ids and its name as text, and so did each of
the four indexes over them, once per span. Most of a training store was those copies
(docs/reliability.md, "Retention"). Now a span's rollout is its `rollouts.seq` (the rollout's id is
already stored there once), and its attempt, trace and name are keys into `span_keys`, where each
distinct string is stored once; the row and its indexes hold one to three bytes per id, and the
span id its 8 bytes. A trace that is the attempt id (every span the gateway records) is NULL, so
the trace index only holds spans of other traces. The body leaves out what the row holds
(`span_codec.strip_head`) and gets it back from these columns on read.

A rollout the store doesn't hold (spans may arrive for any rollout id) is keyed by minus its
`span_keys` key; once the rollout is enqueued its later spans use its seq, so a query by rollout
id looks for both. Keys are looked up inside the transaction that uses them, never cached across
transactions: a group that rolls back would leave a cached key pointing at a row that was never
committed, which a later string could then take.

Every statement here runs on the raw sqlite3 cursor (see `sqlite_ops`), inside the caller's
transaction.
"""

from __future__ import annotations

import contextlib
import json
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from sqlalchemy import Connection
from sqlalchemy.exc import DBAPIError

from reinforge.errors import ReinforgeError
from reinforge.store.sql import sqlite_ops
from reinforge.store.sql.schema import keyed_spans_metadata
from reinforge.store.sql.span_codec import SpanBodyCodec, SpanIds

_SPAN_ID = re.compile(r"[0-9a-f]{16}")
_IDS = "SELECT value FROM json_each(?)"
_KEYS_OF = f"SELECT value, key FROM span_keys WHERE value IN ({_IDS})"
_VALUES_OF = f"SELECT key, value FROM span_keys WHERE key IN ({_IDS})"
_SEQS_OF = f"SELECT rollout_id, seq FROM rollouts WHERE rollout_id IN ({_IDS})"
_IDS_OF_SEQS = f"SELECT seq, rollout_id FROM rollouts WHERE seq IN ({_IDS})"
_NEW_KEY = "INSERT INTO span_keys (value) VALUES (?) RETURNING key"
_INSERT_SPAN = (
    "INSERT INTO spans (span_id, rollout_key, attempt_key, trace_key, name_key, body) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (span_id) DO NOTHING"
)
_INSERT_DICTIONARY = "INSERT OR IGNORE INTO span_dictionaries (dict_id, body) VALUES (?, ?)"
_KEY_OF = "(SELECT key FROM span_keys WHERE value = ?)"
# A rollout id's keys: its seq, and minus its `span_keys` key for spans stored before it was enqueued.
_ROLLOUT_KEYS_OF_ONE = (
    "SELECT seq FROM rollouts WHERE rollout_id = ? UNION ALL SELECT -key FROM span_keys WHERE value = ?"
)
_ROLLOUT_KEYS_AND_IDS = (
    f"SELECT seq, rollout_id FROM rollouts WHERE rollout_id IN ({_IDS}) "
    f"UNION ALL SELECT -key, value FROM span_keys WHERE value IN ({_IDS})"
)
_ROLLOUT_KEYS_OF_MANY = (
    f"SELECT seq FROM rollouts WHERE rollout_id IN ({_IDS}) "
    f"UNION ALL SELECT -key FROM span_keys WHERE value IN ({_IDS})"
)


def span_id_key(span_id: str) -> bytes | str:
    """The `span_id` column's value: the id's 8 bytes (every span id the store takes is 16 hex
    digits; anything else would be kept as it is)."""
    return bytes.fromhex(span_id) if _SPAN_ID.fullmatch(span_id) else span_id


def _span_id_text(value: bytes | str) -> str:
    return value.hex() if isinstance(value, bytes) else value


def insert_spans(
    conn: Connection, rows: Sequence[tuple[str, str, str, str, str, str]], codec: SpanBodyCodec
) -> int:
    """Insert (span_id, trace_id, rollout_id, attempt_id, name, body) rows; returns how many were new
    (an id already stored is skipped). Bodies are compressed here, in the transaction that stores
    them, and so is their dictionary (`span_codec`)."""
    ids = [SpanIds(r[0], r[1], r[2], r[3], r[4]) for r in rows]
    bodies, dictionary = codec.encode_batch([r[5] for r in rows], ids)
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        seqs: dict[str, int] = dict(
            cur.execute(_SEQS_OF, (json.dumps(list({r[2] for r in rows})),)).fetchall()
        )
        strings = {v for r in rows for v in (r[3], r[4])}
        strings |= {r[1] for r in rows if r[1] != r[3]} | {r[2] for r in rows if r[2] not in seqs}
        keys = _keys(cur, strings)
        if dictionary is not None:
            cur.execute(_INSERT_DICTIONARY, dictionary)
        cur.executemany(
            _INSERT_SPAN,
            [
                (
                    span_id_key(r[0]),
                    seqs[r[2]] if r[2] in seqs else -keys[r[2]],
                    keys[r[3]],
                    None if r[1] == r[3] else keys[r[1]],
                    keys[r[4]],
                    body,
                )
                for r, body in zip(rows, bodies, strict=True)
            ],
        )
        return int(cur.rowcount)


def _keys(cur: sqlite3.Cursor, values: set[str]) -> dict[str, int]:
    """Each value's key, adding the ones not stored yet."""
    keys: dict[str, int] = dict(cur.execute(_KEYS_OF, (json.dumps(list(values)),)).fetchall())
    for value in values - keys.keys():
        keys[value] = cur.execute(_NEW_KEY, (value,)).fetchall()[0][0]
    return keys


@dataclass(frozen=True)
class SpanFilter:
    """A span query's filters (None: not filtered on)."""

    rollout_id: str | None = None
    rollout_ids: Sequence[str] | None = None
    attempt_id: str | None = None
    trace_id: str | None = None
    name: str | None = None

    def where(self) -> tuple[str, list[object]]:
        """The WHERE clause (or "") over `spans` and its parameters."""
        conds: list[str] = []
        params: list[object] = []
        if self.rollout_id is not None:
            conds.append(f"rollout_key IN ({_ROLLOUT_KEYS_OF_ONE})")
            params += [self.rollout_id, self.rollout_id]
        if self.rollout_ids is not None:
            conds.append(f"rollout_key IN ({_ROLLOUT_KEYS_OF_MANY})")
            ids = json.dumps(list(dict.fromkeys(self.rollout_ids)))
            params += [ids, ids]
        if self.attempt_id is not None:
            conds.append(f"attempt_key = {_KEY_OF}")
            params.append(self.attempt_id)
        if self.trace_id is not None:
            conds.append(f"(trace_key = {_KEY_OF} OR (trace_key IS NULL AND attempt_key = {_KEY_OF}))")
            params += [self.trace_id, self.trace_id]
        if self.name is not None:
            conds.append(f"name_key = {_KEY_OF}")
            params.append(self.name)
        return (" WHERE " + " AND ".join(conds) if conds else ""), params


def read_page(
    conn: Connection,
    where: SpanFilter,
    limit: int,
    offset: int,
    codec: SpanBodyCodec,
    load_dictionary: Callable[[int], bytes],
) -> list[tuple[int, str]]:
    """(sequence, the span's JSON) for a page of matching spans, in sequence order."""
    clause, params = where.where()
    sql = (
        "SELECT sequence, span_id, rollout_key, attempt_key, trace_key, name_key, body FROM spans"
        f"{clause} ORDER BY sequence LIMIT ? OFFSET ?"
    )
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        rows = cur.execute(sql, (*params, limit, offset)).fetchall()
        if not rows:
            return []
        seqs = {row[2] for row in rows if row[2] > 0}
        keys = {-row[2] for row in rows if row[2] < 0} | {
            k for row in rows for k in row[3:6] if k is not None
        }
        rollouts = dict(cur.execute(_IDS_OF_SEQS, (json.dumps(list(seqs)),)).fetchall()) if seqs else {}
        values = dict(cur.execute(_VALUES_OF, (json.dumps(list(keys)),)).fetchall())
    out = []
    for seq, span_id, rollout, attempt, trace, name, body in rows:
        try:
            ids = SpanIds(
                _span_id_text(span_id),
                values[attempt if trace is None else trace],
                rollouts[rollout] if rollout > 0 else values[-rollout],
                values[attempt],
                values[name],
            )
        except KeyError as e:
            raise ReinforgeError(f"span {seq} names a key ({e.args[0]}) the store doesn't hold") from e
        out.append((seq, codec.decode(body, load_dictionary, ids)))
    return out


def count(conn: Connection, where: SpanFilter) -> int:
    clause, params = where.where()
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        return int(cur.execute(f"SELECT count(*) FROM spans{clause}", params).fetchone()[0])


def bodies_of_rollouts(conn: Connection, rollout_ids: Sequence[str]) -> Iterator[tuple[str, str | bytes]]:
    """(rollout id, stored body) of every span of these rollouts, for a search of the bodies."""
    ids = json.dumps(list(rollout_ids))
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        names = dict(cur.execute(_ROLLOUT_KEYS_AND_IDS, (ids, ids)).fetchall())
        sql = f"SELECT rollout_key, body FROM spans WHERE rollout_key IN ({_ROLLOUT_KEYS_OF_MANY})"
        for key, body in cur.execute(sql, (ids, ids)):
            yield names[key], body


# -- the tables, and moving a store written with the text layout over ---------------------------------

_OLD = "spans_text_layout"
"""Where the text-layout table is while its rows are copied (it is gone when the upgrade commits)."""


def create_tables(conn: Connection) -> None:
    """Create the keyed layout, moving a text-layout `spans` table over first (in the caller's
    transaction: it commits whole or not at all)."""
    with contextlib.closing(sqlite_ops.cursor(conn)) as cur:
        columns = {row[1] for row in cur.execute("PRAGMA table_info(spans)")}
        if "rollout_id" in columns:
            upgrade(conn, cur)
            return
    keyed_spans_metadata.create_all(conn)


def upgrade(conn: Connection, cur: sqlite3.Cursor) -> None:
    """Move the text layout's spans to the keyed layout, keys and sequence numbers preserved.

    Bodies are copied as they are (plain JSON text or format 0x02 both read without the row's ids),
    so the move is one pass of SQL, with no span decoded.
    """
    try:
        driver = conn.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        driver.create_function("reinforge_span_id_key", 1, span_id_key, deterministic=True)
        cur.execute(f"ALTER TABLE spans RENAME TO {_OLD}")
        for index in ("ix_spans_rollout", "ix_spans_attempt", "ix_spans_trace", "ix_spans_name"):
            cur.execute(f"DROP INDEX IF EXISTS {index}")
        keyed_spans_metadata.create_all(conn)
        cur.execute(
            "INSERT OR IGNORE INTO span_keys (value) "
            f"SELECT attempt_id FROM {_OLD} UNION SELECT name FROM {_OLD} "
            f"UNION SELECT trace_id FROM {_OLD} WHERE trace_id != attempt_id "
            f"UNION SELECT rollout_id FROM {_OLD} WHERE rollout_id NOT IN (SELECT rollout_id FROM rollouts)"
        )
        cur.execute(
            "INSERT INTO spans (sequence, span_id, rollout_key, attempt_key, trace_key, name_key, body) "
            "SELECT o.sequence, reinforge_span_id_key(o.span_id), "
            "coalesce((SELECT seq FROM rollouts WHERE rollout_id = o.rollout_id), "
            "-(SELECT key FROM span_keys WHERE value = o.rollout_id)), a.key, "
            "CASE WHEN o.trace_id = o.attempt_id THEN NULL "
            "ELSE (SELECT key FROM span_keys WHERE value = o.trace_id) END, n.key, o.body "
            f"FROM {_OLD} o JOIN span_keys a ON a.value = o.attempt_id "
            "JOIN span_keys n ON n.value = o.name ORDER BY o.sequence"
        )
        cur.execute(f"DROP TABLE {_OLD}")
    except (sqlite3.Error, DBAPIError) as e:
        raise ReinforgeError(
            f"could not upgrade this store's spans to the current layout ({e}); the file is unchanged. "
            "Open it with the reinforge version that wrote it, or free disk space and try again"
        ) from e
