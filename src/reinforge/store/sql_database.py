"""Where the SQL store's transactions run: SQLite in one writer thread, PostgreSQL in a thread pool.

Every store operation is one short synchronous transaction function over a SQLAlchemy `Connection`.
Running it whole in a worker thread costs one thread hop per operation (not one per statement, as an
async driver would), and it makes the store usable from any event loop or thread: the HTTP server's
loop, a test's loop, a tracing exporter's thread.

PostgreSQL wake-ups across processes use LISTEN/NOTIFY: a transaction that queues or finishes work
sends `pg_notify` (delivered on commit), and a listener thread turns each notification into an
in-process `Signal` fire.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.pool import StaticPool

from reinforge.errors import InvalidRequestError, StoreUnavailableError
from reinforge.store.sql_schema import metadata

R = TypeVar("R")
Synchronous = Literal["NORMAL", "FULL"]

log = logging.getLogger(__name__)

# Deadlock and serialization failure: the transaction is safe to run again from the start.
_RETRY_SQLSTATES = {"40P01", "40001"}
_MAX_TRIES = 8


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
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[Any]


class SqliteDatabase(Database):
    """One connection in one writer thread, with group commit.

    SQLite has a single writer anyway. Operations queue up for the writer thread, which runs every
    operation waiting at that moment in one transaction: one commit and one thread hop serve many
    concurrent callers, which is where the time of a small SQLite write goes. WAL lets readers in
    other processes (`reinforge store status`) read while it writes.
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
            cur.execute("PRAGMA journal_mode=WAL")
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
        self._conn: Connection | None = None
        self._conn_lock = threading.Lock()  # callers on other threads (and loops) share the connection
        self._pending_lock = threading.Lock()
        self._pending: dict[asyncio.AbstractEventLoop, list[_Job]] = {}

    async def start(self) -> None:
        await self.write(lambda conn: metadata.create_all(conn))

    async def _run(self, fn: Callable[[Connection], R], *, write: bool) -> R:
        self._check_open()
        loop = asyncio.get_running_loop()
        job = _Job(fn, loop, loop.create_future())
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
        for i in range(0, len(pending), self._MAX_GROUP):
            group = pending[i : i + self._MAX_GROUP]
            with self._conn_lock:
                outcomes = self._run_group(group)
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
            self._conn = self.engine.connect()
        conn = self._conn
        if len(group) > 1:
            try:
                with conn.begin():
                    results = [job.fn(conn) for job in group]
            except Exception:
                pass  # one job failed: run each alone below, so only that one sees its error
            else:
                return [(r, None) for r in results]
        outcomes: list[tuple[Any, BaseException | None]] = []
        for job in group:
            try:
                with conn.begin():
                    outcomes.append((job.fn(conn), None))
            except DBAPIError as e:
                error: BaseException = (
                    StoreUnavailableError(f"the database failed: {e.orig}")
                    if isinstance(e, OperationalError)
                    else e
                )
                outcomes.append((None, error))
            except Exception as e:
                outcomes.append((None, e))
        return outcomes

    def _shutdown(self) -> None:
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
        await asyncio.get_running_loop().run_in_executor(self._pool, self._create_schema)
        self._listener.start()

    def _create_schema(self) -> None:
        with self.engine.begin() as conn:
            # Several servers may start at once on one database: one creates, the others wait.
            conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('reinforge.create_schema'))"))
            if self.schema is not None:
                conn.exec_driver_sql(f'CREATE SCHEMA IF NOT EXISTS "{self.schema}"')
            metadata.create_all(conn)

    async def _run(self, fn: Callable[[Connection], R], *, write: bool) -> R:
        self._check_open()
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, self._transaction, fn)
        except RuntimeError as e:  # the executor was shut down by a concurrent close()
            raise StoreUnavailableError("the store is closed") from e

    def _transaction(self, fn: Callable[[Connection], R]) -> R:
        for tries in range(1, _MAX_TRIES + 1):
            try:
                with self.engine.begin() as conn:
                    return fn(conn)
            except DBAPIError as e:
                if tries < _MAX_TRIES and getattr(e.orig, "sqlstate", None) in _RETRY_SQLSTATES:
                    time.sleep(0.001 * 2**tries)
                    continue
                if isinstance(e, OperationalError):
                    raise StoreUnavailableError(f"the database failed: {e.orig}") from e
                raise
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
