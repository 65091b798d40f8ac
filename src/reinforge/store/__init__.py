"""reinforge.store: the store protocol and its backends.

`open_store(url)` picks the backend from the URL: `memory://`, `sqlite:///path.db`,
`postgresql://...`, or `http(s)://...` (a store server, through HttpStoreClient).
"""

from reinforge.store.factory import open_store
from reinforge.store.memory import MemoryStore
from reinforge.store.protocol import Store
from reinforge.store.sql.store import SqlStore

__all__ = ["MemoryStore", "SqlStore", "Store", "open_store"]
