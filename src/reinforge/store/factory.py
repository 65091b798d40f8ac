"""Open a store from a URL, so every command and config names its store the same way."""

from __future__ import annotations

from reinforge.errors import InvalidRequestError
from reinforge.store.memory import MemoryStore
from reinforge.store.protocol import Store

STORE_URL_FORMS = (
    "memory://",
    "sqlite:///relative/path.db",
    "sqlite:////absolute/path.db",
    "postgresql://user@host:5432/database[?schema=name]",
    "http(s)://host:port (a `reinforge store serve` server; give its token)",
)


async def open_store(url: str, token: str | None = None) -> Store:
    """The store at `url`; `token` is the bearer token of an HTTP store and ignored by the others."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme == "memory":
        return MemoryStore()
    if scheme.startswith(("sqlite", "postgres")):
        from reinforge.store.sql.store import SqlStore

        return await SqlStore.open(url)
    if scheme in ("http", "https"):
        from reinforge.store.http.client import HttpStoreClient

        return HttpStoreClient(url, token)
    raise InvalidRequestError(f"unknown store URL {url!r}; use one of: {'; '.join(STORE_URL_FORMS)}")
