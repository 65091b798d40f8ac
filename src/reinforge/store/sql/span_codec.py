"""Span bodies as SQLite keeps them: deflated against a dictionary of recent spans.

Why: a training run's spans repeat themselves. Every LLM span carries the same attribute keys, the
same tool schemas, the conversation so far and its token ids; an attempt's calls resend the earlier
turns, and a group's rollouts send the same task. Compressed one at a time, a span of a few KB
shrinks little (too little repeats inside one span); deflated against a dictionary of recent spans,
the repeats become back-references (docs/reliability.md, "Retention", has the figures). Each body
is still compressed on its own, so one span reads without its neighbours. Nothing is dropped: a
body reads back byte for byte, so every reader (credit, the dashboard, the API) sees what was sent.

Format of a compressed body (a BLOB in the `body` column; a TEXT body starting with `{` is plain JSON,
as older stores and PostgreSQL keep it, and reads as before):

    0x01 | dictionary id (8 bytes, big-endian; 0 = no dictionary) | raw deflate, 16 KB window

Dictionaries live in the `span_dictionaries` table, named by a hash of their bytes, and every batch
that uses one inserts it if absent in its own transaction (a no-op after the first): a batch that
rolls back can't leave spans pointing at a dictionary that was never committed, and two processes
writing one file can't give one id to two dictionaries. A store builds its first dictionary once
`_DICT_BYTES` of bodies have passed (the spans before it are deflated alone) and a fresh one every
`_REFRESH_SPANS` spans, so the dictionary follows a workload that changes; each is 16 KB.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import zlib
from collections import deque
from collections.abc import Callable, Sequence

from sqlalchemy import BigInteger, Column, LargeBinary, Table

from reinforge.store.sql.schema import metadata

FORMAT_DEFLATE = 0x01
_HEADER = struct.Struct(">BQ")
_DICT_BYTES = 16 * 1024
"""The window (`_WBITS`): a longer dictionary is never referenced. 32 KB compressed no better on
training spans and copying the larger compressor state per span cost about a tenth more."""
_WBITS = 14
_REFRESH_SPANS = 100_000
_LEVEL = 6

span_dictionaries = Table(
    "span_dictionaries",
    metadata,
    Column("dict_id", BigInteger, primary_key=True, autoincrement=False),
    Column("body", LargeBinary, nullable=False),
)


class SpanBodyCodec:
    """Encodes bodies on the store's single writer; decodes on any thread."""

    def __init__(self) -> None:
        self._recent: deque[bytes] = deque()
        self._recent_bytes = 0
        self._dict: tuple[int, bytes] | None = None
        self._compressor: zlib._Compress | None = None
        self._since_dict = 0
        self._dicts: dict[int, bytes] = {}
        self._lock = threading.Lock()

    def encode_batch(self, bodies: Sequence[str]) -> tuple[list[bytes], tuple[int, bytes] | None]:
        """The bodies compressed, and the dictionary (id, bytes) they need stored with them."""
        out = []
        used: tuple[int, bytes] | None = None
        for body in bodies:
            raw = body.encode()
            self._remember(raw)
            if (
                self._dict is None or self._since_dict >= _REFRESH_SPANS
            ) and self._recent_bytes >= _DICT_BYTES:
                self._new_dictionary()
            self._since_dict += 1
            if self._compressor is None or self._dict is None:
                deflate = zlib.compressobj(_LEVEL, zlib.DEFLATED, -_WBITS)
                dict_id = 0
            else:
                deflate = self._compressor.copy()
                dict_id = self._dict[0]
                used = self._dict
            out.append(_HEADER.pack(FORMAT_DEFLATE, dict_id) + deflate.compress(raw) + deflate.flush())
        return out, used

    def decode(self, stored: str | bytes, load_dictionary: Callable[[int], bytes]) -> str:
        """The span's JSON text, from a plain TEXT body or a compressed one."""
        if isinstance(stored, str):
            return stored
        if len(stored) < _HEADER.size or stored[0] != FORMAT_DEFLATE:
            raise ValueError(f"unknown span body format {stored[:1]!r}: written by a newer reinforge?")
        _, dict_id = _HEADER.unpack_from(stored)
        if dict_id:
            zdict = self._dicts.get(dict_id)
            if zdict is None:
                zdict = load_dictionary(dict_id)
                with self._lock:
                    self._dicts[dict_id] = zdict
            inflate = zlib.decompressobj(-_WBITS, zdict=zdict)
        else:
            inflate = zlib.decompressobj(-_WBITS)
        return (inflate.decompress(stored[_HEADER.size :]) + inflate.flush()).decode()

    def _remember(self, raw: bytes) -> None:
        self._recent.append(raw)
        self._recent_bytes += len(raw)
        while self._recent_bytes - len(self._recent[0]) >= _DICT_BYTES:
            self._recent_bytes -= len(self._recent.popleft())

    def _new_dictionary(self) -> None:
        # The latest spans, newest last: deflate finds a match at the shortest distance first.
        zdict = b"".join(self._recent)[-_DICT_BYTES:]
        # 63 bits: SQLite's INTEGER and PostgreSQL's BIGINT are signed; 0 means "no dictionary".
        dict_id = int.from_bytes(hashlib.blake2b(zdict, digest_size=8).digest()) >> 1 or 1
        self._dict = (dict_id, zdict)
        with self._lock:
            self._dicts[dict_id] = zdict
        self._compressor = zlib.compressobj(_LEVEL, zlib.DEFLATED, -_WBITS, zdict=zdict)
        self._since_dict = 0
