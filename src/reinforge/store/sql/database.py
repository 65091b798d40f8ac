"""Where the SQL store's transactions run: SQLite inline with group commit, PostgreSQL in a pool.

Every store operation is one short synchronous transaction function over a SQLAlchemy `Connection`.
Both ways of running it work from any event loop or thread: the HTTP server's loop, a test's loop,
a tracing exporter's thread.

PostgreSQL wake-ups across processes use LISTEN/NOTIFY: a transaction that queues or finishes work
sends `pg_notify` (delivered on commit), and a listener thread turns each notification into an
in-process `Signal` fire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DataError, DBAPIError, OperationalError
from sqlalchemy.pool import StaticPool

from reinforge.errors import InvalidRequestError, StoreUnavailableError
from reinforge.store.sql import sqlite_spans
from reinforge.store.sql.schema import metadata, text_spans_metadata

R = TypeVar("R")
Synchronous = Literal["NORMAL", "FULL"]

log = logging.getLogger(__name__)

# Deadlock and serialization failure: the transaction is safe to run again from the start.
_RETRY_SQLSTATES = {"40P01", "40001"}
_MAX_TRIES = 8
_CHECKPOINT_SECONDS = 1.0
_PAGE_SIZE = 16384
"""SQLite's page size for a new database file (an existing file keeps its own).

A commit writes each page it touched to the WAL, one write per page, plus a checksum over it. With
ids that sort by creation time (`reinforge.types.new_ordered_id`, `new_span_id`) a span batch touches
only the last few pages of each index, so what a commit writes is mostly the spans themselves, and
larger pages mean fewer writes for the same bytes, and less server CPU per span. Ids from elsewhere
that are random (an OpenTelemetry SDK's span ids) still cost a page per span in their index: with
them larger pages write more bytes, at no more CPU (docs/store.md, "SQLite", gives the figures).
"""
_WAL_RESTART_BYTES = 512 * 1024 * 1024
"""A WAL this large is started over from its beginning at the next good chance (see `_checkpoint`).
Large, because starting over holds the writer for two fsyncs (long on a busy disk), while a longer
WAL costs each commit only a little per span."""
_WAL_FORCE_RESTART_BYTES = 2 * 1024 * 1024 * 1024
"""A WAL this large is started over at the next chance, however slowly the disk syncs right then."""
_CATCH_UP_BYTES = 1024 * 1024
"""At most this much WAL left to copy, the checkpointer copies it with the writer held off."""
_QUICK_SYNC_SECONDS = 0.015
"""A small checkpoint pass (two fsyncs) faster than this says the disk syncs quickly right now."""


def translate_error(e: Exception) -> Exception:
    """Database failures as the package's errors: a value the database can't hold is the caller's
    mistake (400), a database that fails is unavailable (503); anything else is a bug and stays."""
    if isinstance(e, DataError | OverflowError):
        detail = e.orig if isinstance(e, DataError) else e
        return InvalidRequestError(f"the database rejected a value: {detail}")
    if isinstance(e, OperationalError):
        return StoreUnavailableError(f"the database failed: {e.orig}")
    return e


class Database:
    """Runs transaction functions off the event loop; subclasses decide on which threads."""

    dialect: Literal["sqlite", "postgresql"]

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._listeners: list[Callable[[str], None]] = []
        self._closed = False

    def on_notify(self, callback: Callable[[str], None]) -> None:
        """Call `callback(payload)` for each notification, from this process or (PostgreSQL) others."""
        self._listeners.append(callback)

    def deliver(self, payload: str) -> None:
        for cb in self._listeners:
            cb(payload)

    def notify(self, conn: Connection, payload: str) -> None:
        """Inside a transaction: tell other processes about `payload` once it commits."""

    async def start(self) -> None:
        """Create the tables if needed and start the worker threads."""
        raise NotImplementedError

    async def write(self, fn: Callable[[Connection], R]) -> R:
        return await self._run(fn, write=True)

    async def write_bulk(self, fn: Callable[[Connection], R]) -> R:
        """A large write (a span batch) that small writes such as leases may overtake."""
        return await self._run(fn, write=True)

    async def read(self, fn: Callable[[Connection], R]) -> R:
        return await self._run(fn, write=False)

    async def _run(self, fn: Callable[[Connection], R], *, write: bool) -> R:
        raise NotImplementedError

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._shutdown)

    def _shutdown(self) -> None:
        self.engine.dispose()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreUnavailableError("the store is closed")


@dataclass
class _Job:
    fn: Callable[[Connection], Any]
    future: asyncio.Future[Any]
    bulk: bool = False
    deferred: bool = False


class SqliteDatabase(Database):
    """One connection, used on the caller's own event loop, with group commit.

    SQLite has a single writer anyway, and a small write costs far less than handing it to another
    thread and back (on a busy machine the GIL hand-over alone costs milliseconds). So operations
    run inline, and every operation queued during one loop iteration shares one transaction: one
    commit serves many concurrent callers. A lock lets other threads and loops share the
    connection. WAL lets readers in other processes (`reinforge store status`) read meanwhile.
    """

    dialect = "sqlite"
    _MAX_GROUP = 64

    def __init__(self, path: str, synchronous: Synchronous) -> None:
        if path != ":memory:":
            Path(path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            f"sqlite+pysqlite:///{path}",
            poolclass=StaticPool,
            connect_args={"check_same_thread": False, "isolation_level": None, "timeout": 30.0},
        )

        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_conn: Any, _record: Any) -> None:
            cur = dbapi_conn.cursor()
            # See `_PAGE_SIZE`. Only a new, empty file takes it.
            cur.execute(f"PRAGMA page_size={_PAGE_SIZE}")
            cur.execute("PRAGMA journal_mode=WAL")
            # Checkpoints (copying the WAL back into the file, with fsyncs) run in the checkpointer
            # thread, not inside a commit on the caller's event loop.
            cur.execute("PRAGMA wal_autocheckpoint=0")
            # A restarted WAL keeps its file (cached pages are overwritten, not fresh ones appended).
            cur.execute(f"PRAGMA journal_size_limit={_WAL_RESTART_BYTES}")
            # NORMAL in WAL mode: a commit reaches the OS before it returns, so it survives the
            # process being killed; only an OS crash or power cut may lose the last commits.
            cur.execute(f"PRAGMA synchronous={synchronous}")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA cache_size=-65536")
            cur.execute("PRAGMA temp_store=MEMORY")
            cur.close()

        @event.listens_for(engine, "begin")
        def _begin(conn: Connection) -> None:
            # IMMEDIATE takes the write lock up front, so a second process never deadlocks on an
            # upgrade from a read lock.
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        super().__init__(engine)
        self._path = path
        self._dirty = threading.Event()  # set by every commit, cleared by the checkpointer
        self._stop = threading.Event()
        self._checkpointer = threading.Thread(
            target=self._checkpoint, name="reinforge-sqlite-ckpt", daemon=True
        )
        self._conn: Connection | None = None
        self._conn_lock = threading.Lock()  # callers on other threads (and loops) share the connection
        self._pending_lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[_Job]] = {}

    async def start(self) -> None:
        try:
            await self.write(self._create_tables)
        except Exception:
            await self.close()
            raise
        if self._path != ":memory:":
            self._checkpointer.start()

    @staticmethod
    def _create_tables(conn: Connection) -> None:
        metadata.create_all(conn)
        sqlite_spans.create_tables(conn)  # SQLite's own span layout, upgrading an older file's

    def _checkpoint(self) -> None:
        """Copy the WAL back into the database file while writes come in, and keep the WAL bounded.

        PASSIVE never blocks the writer; its fsyncs happen on this thread, off the event loop. But
        SQLite starts the WAL over only when a write begins with every frame already copied, which
        under a steady stream of commits never happens by itself: the WAL would grow without end,
        and every commit would cost more (fresh file blocks, a longer WAL index to search). So once
        the WAL is large and a pass has left little, that last bit is copied with the writer held
        off, and the next commit starts the WAL from the beginning. Holding the writer lasts two
        fsyncs, so it is only done when a small pass just synced quickly (the disk is not busy),
        unless the WAL has grown very large.
        """
        with contextlib.closing(sqlite3.connect(self._path, timeout=30.0, isolation_level=None)) as conn:
            page_size = int(conn.execute("PRAGMA page_size").fetchone()[0])
            restart_frames = _WAL_RESTART_BYTES // page_size
            force_frames = _WAL_FORCE_RESTART_BYTES // page_size
            catch_up_frames = _CATCH_UP_BYTES // page_size

            def checkpoint() -> tuple[int, int, float]:
                started = time.monotonic()
                _, frames, copied = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                return int(frames), int(copied), time.monotonic() - started

            behind = False
            while not self._stop.wait(0.0 if behind else _CHECKPOINT_SECONDS):
                behind = False
                if not self._dirty.is_set():
                    continue
                self._dirty.clear()
                try:
                    frames, copied, _ = checkpoint()
                    if frames < restart_frames:
                        continue
                    # A second pass copies what came in during the first: about what the pass
                    # with the writer held off would copy, so its time predicts that hold.
                    frames, copied, took = checkpoint()
                    if frames - copied > catch_up_frames:
                        behind = True  # commits came faster than the passes copied: go again now
                        self._dirty.set()
                    elif took < _QUICK_SYNC_SECONDS or frames >= force_frames:
                        with self._conn_lock:
                            checkpoint()
                    else:
                        self._dirty.set()  # the disk syncs slowly right now: try next round
                except sqlite3.Error as e:  # a later pass retries; the WAL only grows meanwhile
                    log.warning("SQLite checkpoint failed (%s); retrying", e)

    async def _run(self, fn: Callable[[Connection], R], *, write: bool) -> R:
        return await self._queue(fn, bulk=False)

    async def write_bulk(self, fn: Callable[[Connection], R]) -> R:
        return await self._queue(fn, bulk=True)

    async def _queue(self, fn: Callable[[Connection], R], *, bulk: bool) -> R:
        self._check_open()
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop.create_future(), bulk)
        with self._pending_lock:
            group = self._pending.setdefault(loop, [])
            group.append(job)
            first = len(group) == 1
        if first:
            # Run once the loop has let every ready task queue its operation: they share one commit.
            loop.call_soon(self._flush, loop)
        result: R = await job.future
        return result

    def _flush(self, loop: asyncio.AbstractEventLoop) -> None:
        with self._pending_lock:
            pending = self._pending.pop(loop, [])
        later: list[_Job] = []
        if any(not job.bulk for job in pending) and any(job.bulk and not job.deferred for job in pending):
            # A span batch costs milliseconds; leases and finishes queued with it would wait for it,
            # as their callers resume only after this callback. So a batch that just arrived waits
            # one loop turn (once: it runs on the next turn whatever arrives meanwhile).
            later = [job for job in pending if job.bulk and not job.deferred]
            pending = [job for job in pending if not job.bulk or job.deferred]
        pending.sort(key=lambda job: job.bulk)  # small writes first, in their own group when many
        self._run_jobs(pending)
        if later:
            for job in later:
                job.deferred = True
            with self._pending_lock:
                group = self._pending.setdefault(loop, [])
                first = not group
                group[:0] = later
            if first:
                # Scheduled after the small writes' callers were woken, so they answer first.
                loop.call_soon(self._flush, loop)

    def _run_jobs(self, pending: list[_Job]) -> None:
        for i in range(0, len(pending), self._MAX_GROUP):
            group = pending[i : i + self._MAX_GROUP]
            try:
                with self._conn_lock:
                    outcomes = self._run_group(group)
            except Exception as e:  # never leave a caller waiting on a future nobody will settle
                outcomes = [(None, e)] * len(group)
            for job, (result, error) in zip(group, outcomes, strict=True):
                if job.future.done():  # the caller was cancelled; the work is done anyway
                    continue
                if error is not None:
                    job.future.set_exception(error)
                else:
                    job.future.set_result(result)

    def _run_group(self, group: list[_Job]) -> list[tuple[Any, BaseException | None]]:
        """Run the jobs in one transaction; if one fails, run each in its own."""
        if self._closed:  # closed between queueing and flushing
            return [(None, StoreUnavailableError("the store is closed"))] * len(group)
        if self._conn is None:
            try:
                self._conn = self.engine.connect()
            except Exception as e:
                return [(None, translate_error(e))] * len(group)
        conn = self._conn
        if len(group) > 1:
            try:
                with conn.begin():
                    results = [job.fn(conn) for job in group]
            except Exception:
                pass  # one job failed: run each alone below, so only that one sees its error
            else:
                self._dirty.set()
                return [(r, None) for r in results]
        self._dirty.set()
        outcomes: list[tuple[Any, BaseException | None]] = []
        for job in group:
            try:
                with conn.begin():
                    outcomes.append((job.fn(conn), None))
            except Exception as e:
                outcomes.append((None, translate_error(e)))
        return outcomes

    def _shutdown(self) -> None:
        self._stop.set()
        if self._checkpointer.is_alive():
            self._checkpointer.join()
        with self._conn_lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        super()._shutdown()


class PostgresDatabase(Database):
    """A pool of connections, one per worker thread; leases use `FOR UPDATE SKIP LOCKED`, so several
    stores (several server processes) can share one database."""

    dialect = "postgresql"

    def __init__(self, url: URL, schema: str | None, workers: int) -> None:
        self.schema = schema
        self._dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        options: dict[str, Any] = {}
        if schema is not None:
            options["schema_translate_map"] = {None: schema}
        engine = create_engine(
            url.set(drivername="postgresql+psycopg"),
            pool_size=workers,
            max_overflow=0,
            execution_options=options,
        )
        super().__init__(engine)
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reinforge-pg")
        self.channel = "reinforge_" + (schema or "public")
        self._stop = threading.Event()
        self._listener = threading.Thread(target=self._listen, name="reinforge-pg-listen", daemon=True)

    async def start(self) -> None:
        try:
            await asyncio.get_running_loop().run_in_executor(self._pool, self._create_schema)
        except Exception as e:
            await self.close()
            raise translate_error(e) from e
        self._listener.start()

    def _create_schema(self) -> None:
        with self.engine.begin() as conn:
            # Several servers may start at once on one database: one creates, the others wait.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('reinforge.create_schema'))"))
            if self.schema is not None:
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            metadata.create_all(conn)
            text_spans_metadata.create_all(conn)

    async def _run(self, fn: Callable[[Connection], R], *, write: bool) -> R:
        self._check_open()
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, self._transaction, fn)
        except RuntimeError as e:  # the executor was shut down by a concurrent close()
            raise StoreUnavailableError("the store is closed") from e
        return await future

    def _transaction(self, fn: Callable[[Connection], R]) -> R:
        for tries in range(1, _MAX_TRIES + 1):
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except Exception as e:
                if (
                    isinstance(e, DBAPIError)
                    and tries < _MAX_TRIES
                    and getattr(e.orig, "sqlstate", None) in _RETRY_SQLSTATES
                ):
                    time.sleep(0.001 * 2**tries)
                    continue
                raise translate_error(e) from e
        raise AssertionError("unreachable")

    def notify(self, conn: Connection, payload: str) -> None:
        conn.execute(
            text("SELECT pg_notify(:channel, :payload)"), {"channel": self.channel, "payload": payload}
        )

    def _listen(self) -> None:
        import psycopg

        while not self._stop.is_set():
            try:
                with psycopg.connect(self._dsn, autocommit=True) as conn:
                    conn.execute(f'LISTEN "{self.channel}"')
                    # Wake everyone after (re)connecting: a notification may have been missed.
                    self.deliver("*")
                    while not self._stop.is_set():
                        for note in conn.notifies(timeout=5.0):
                            if self._stop.is_set():
                                break
                            self.deliver(note.payload)
            except Exception as e:  # the waits re-check on a timer, so a lost listener only slows them
                log.warning("PostgreSQL LISTEN connection failed (%s); reconnecting in 1 s", e)
                self._stop.wait(1.0)

    def _shutdown(self) -> None:
        self._stop.set()
        if self._listener.is_alive():
            import psycopg

            # A notification of our own wakes the listener now instead of at its next timeout.
            with contextlib.suppress(psycopg.Error), psycopg.connect(self._dsn, autocommit=True) as conn:
                conn.execute("SELECT pg_notify(%s, 'stop')", (self.channel,))
            self._listener.join(timeout=10.0)
        self._pool.shutdown(wait=True)
        super()._shutdown()


_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")


def open_database(
    url: str, *, schema: str | None = None, synchronous: Synchronous = "NORMAL", workers: int = 8
) -> Database:
    """Parse a store URL and build (not yet initialise) its database."""
    try:
        parsed = make_url(url)
    except Exception as e:
        raise InvalidRequestError(f"not a database URL: {url!r} ({e})") from e
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if synchronous not in ("NORMAL", "FULL"):
            raise InvalidRequestError(f"synchronous must be NORMAL or FULL, got {synchronous!r}")
        return SqliteDatabase(parsed.database or ":memory:", synchronous)
    if backend in ("postgresql", "postgres"):
        query = dict(parsed.query)
        url_schema = query.pop("schema", None)
        if isinstance(url_schema, tuple):
            url_schema = url_schema[-1]
        schema = schema or url_schema
        if schema is not None and not _SCHEMA_NAME.match(schema):
            raise InvalidRequestError(
                f"schema must be lower-case letters, digits and underscores (at most 48), got {schema!r}"
            )
        return PostgresDatabase(parsed.set(drivername="postgresql", query=query), schema, workers)
    raise InvalidRequestError(f"unsupported database {backend!r} in {url!r}; use sqlite:/// or postgresql://")
