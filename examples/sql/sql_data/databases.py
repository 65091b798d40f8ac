"""Deterministic SQLite files for each `<domain>_<n>`, built once into a cache folder and reused.

Rollout workers in several processes may ask for the same database at once, so a file is written under
a temporary name in the cache folder and moved into place with `os.replace`: a reader sees either no
file or a complete one, never a half-written one.
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
from pathlib import Path

from .schemas import domain_of, generate_rows, schema_ddl

DATA_VERSION = 1
"""Part of every file name: bump it when the generators change, so stale caches are never reused."""

CACHE_ENV = "REINFORGE_SQL_CACHE"
_DEFAULT_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "dbs"


def cache_dir() -> Path:
    """The cache folder, read from the environment at every call so tests can point it elsewhere."""
    override = os.environ.get(CACHE_ENV)
    return Path(override) if override else _DEFAULT_CACHE


def _file_name(db_id: str) -> str:
    return f"{db_id}.v{DATA_VERSION}.sqlite"


def _write(path: Path, db_id: str) -> None:
    domain = domain_of(db_id)
    rows = generate_rows(domain, random.Random(f"sql-db:{db_id}"))
    conn = sqlite3.connect(path)
    try:
        # The file is private until os.replace publishes it, so no journal or fsync is needed to keep
        # readers safe; skipping them makes a build take milliseconds.
        conn.execute("PRAGMA journal_mode = OFF")
        conn.execute("PRAGMA synchronous = OFF")
        conn.execute("PRAGMA foreign_keys = ON")
        for statement in schema_ddl(domain):
            conn.execute(statement)
        for table in domain.tables:
            marks = ", ".join("?" for _ in table.columns)
            conn.executemany(f"INSERT INTO {table.name} VALUES ({marks})", rows[table.name])
        conn.commit()
    finally:
        conn.close()


def build_database(db_id: str) -> Path:
    """The database's file, built now unless a complete one is already cached."""
    folder = cache_dir()
    path = folder / _file_name(db_id)
    if path.exists():
        return path
    domain_of(db_id)  # fail on an unknown id before touching the folder
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{db_id}.", suffix=".tmp", dir=folder)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        _write(tmp, db_id)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def database_path(db_id: str) -> Path:
    """Where the database lives, building it on demand (what the agent and the reward call)."""
    return build_database(db_id)
