"""The agent's `search(query)` tool: SQLite FTS5 full-text search, ranked by FTS5's own bm25.

The index is a SQLite file built once into a cache folder (``examples/rag/.cache/`` unless
``REINFORGE_RAG_CACHE`` names another) and then opened read-only, so many rollout processes can share
it. Its file name carries a digest of the corpus, so a changed world gets a fresh index instead of a
stale one; it is written to a temporary file and moved into place with `os.replace`, so processes
building it at the same time never see a half-written index.

Queries come from a model and can be anything: they are reduced to their word tokens, each quoted
and joined with OR, so no FTS5 operator or stray quote ever reaches the query parser.
"""

from __future__ import annotations

import hashlib
import os
import re
import sqlite3
import tempfile
import threading
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

from .corpus import Document, default_documents

CACHE_ENV = "REINFORGE_RAG_CACHE"
DEFAULT_CACHE_DIR = Path(__file__).resolve().parent.parent / ".cache"
INDEX_VERSION = 1
"""Bump when the table layout changes: it is part of the index file's name."""
TITLE_WEIGHT = 10.0
"""bm25 weight of the title column against the text's 1.0: a name's own document ranks first."""
MAX_QUERY_TERMS = 32
"""A 500-character query keeps its first 32 distinct words: enough to match, cheap to rank."""
MAX_K = 50

_TOKEN = re.compile(r"[^\W_]+")


class Fts5UnavailableError(RuntimeError):
    """This Python's SQLite was built without FTS5, which the search needs."""


@lru_cache(maxsize=1)
def check_fts5() -> None:
    """Raise a clear error, once, when the stdlib sqlite3 lacks FTS5 (rather than a bare SQL error later)."""
    conn = sqlite3.connect(":memory:")
    try:
        conn.execute("CREATE VIRTUAL TABLE probe USING fts5(body)")
    except sqlite3.OperationalError as e:
        raise Fts5UnavailableError(
            f"SQLite {sqlite3.sqlite_version} has no FTS5 module ({e}); the RAG example needs a Python "
            "whose sqlite3 is built with FTS5 (the python.org and most distribution builds are)"
        ) from e
    finally:
        conn.close()


def fts_query(query: str) -> str | None:
    """The FTS5 MATCH expression for a free-text query: its quoted word tokens ORed; None when it has none."""
    tokens = list(dict.fromkeys(t.lower() for t in _TOKEN.findall(query)))[:MAX_QUERY_TERMS]
    if not tokens:
        return None
    return " OR ".join(f'"{t}"' for t in tokens)  # tokens hold no quote: [^\W_] is letters and digits


def cache_dir() -> Path:
    """Where index files live: $REINFORGE_RAG_CACHE, else examples/rag/.cache/ (read at each call)."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else DEFAULT_CACHE_DIR


def corpus_digest(documents: Sequence[Document]) -> str:
    """A digest of what the index holds: a different corpus or layout gets a different file."""
    h = hashlib.sha256(f"rag-index-v{INDEX_VERSION}\n".encode())
    for d in documents:
        h.update(f"{d.title}\t{d.text}\n".encode())
    return h.hexdigest()[:16]


def _build(path: Path, documents: Sequence[Document]) -> None:
    """Write the index to a temporary file beside `path`, then move it into place atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        conn = sqlite3.connect(tmp)
        try:
            conn.execute("CREATE VIRTUAL TABLE docs USING fts5(title, body, tokenize = 'unicode61')")
            conn.executemany(
                "INSERT INTO docs(title, body) VALUES (?, ?)", [(d.title, d.text) for d in documents]
            )
            conn.execute("INSERT INTO docs(docs) VALUES ('optimize')")  # one b-tree segment: faster reads
            conn.commit()
        finally:
            conn.close()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class SearchIndex:
    """A read-only FTS5 index over the documents; safe to share between threads."""

    def __init__(self, documents: Sequence[Document] | None = None, cache: Path | str | None = None) -> None:
        check_fts5()
        docs = default_documents() if documents is None else documents
        folder = Path(cache) if cache is not None else cache_dir()
        self.path = folder / f"rag-index-{corpus_digest(docs)}.sqlite"
        if not self.path.exists():
            _build(self.path, docs)
        self._conn = sqlite3.connect(
            f"{self.path.resolve().as_uri()}?mode=ro", uri=True, check_same_thread=False
        )
        self._lock = threading.Lock()

    def search(self, query: str, k: int = 2) -> list[str]:
        """The texts of the `k` best documents for `query`, best first; [] for a query without words."""
        match = fts_query(query) if isinstance(query, str) else None
        k = min(k, MAX_K)
        if match is None or k <= 0:
            return []
        sql = (
            "SELECT body FROM docs WHERE docs MATCH ? "
            f"ORDER BY bm25(docs, {TITLE_WEIGHT}, 1.0), rowid LIMIT ?"
        )
        try:
            with self._lock:
                rows = self._conn.execute(sql, (match, k)).fetchall()
        except sqlite3.OperationalError:
            return []  # a token FTS5 still rejects must not crash a rollout: no results, like no match
        return [str(body) for (body,) in rows]

    def close(self) -> None:
        with self._lock:
            self._conn.close()


@lru_cache(maxsize=1)
def default_index() -> SearchIndex:
    """The index of the default world, built on first use and shared by the process."""
    return SearchIndex()


def search(query: str, k: int = 2) -> list[str]:
    """The agent's tool: the `k` best documents of the default corpus for `query`, best first."""
    return default_index().search(query, k)
