"""Span bodies as SQLite keeps them: zstd-compressed against a dictionary of recent spans.

Why: a training run's spans repeat themselves. Every LLM span carries the same attribute keys, the
same tool schemas, the conversation so far and its token ids; an attempt's calls resend the earlier
turns, and a group's rollouts send the same task. Compressed one at a time, a span of a few KB
shrinks little (too little repeats inside one span); compressed against a dictionary of recent
spans, the repeats become back-references (docs/reliability.md, "Retention", has the figures). Each
body is still compressed on its own, so one span reads without its neighbours. Nothing is dropped: a
body reads back byte for byte, so every reader (credit, the dashboard, the API) sees what was sent.
zstd (the `zstandard` package) rather than zlib: with a prepared dictionary it compresses a span in
a fraction of deflate's time (which also has to copy its whole state per span to reuse a
dictionary) at a better ratio, and the store's write path is its hottest (docs/reliability.md).

Format of a compressed body (a BLOB in the `body` column; a TEXT body starting with `{` is plain JSON,
as older stores and PostgreSQL keep it, and reads as before):

    0x02 | dictionary id (8 bytes, big-endian; 0 = no dictionary) | zstd frame of the whole JSON
    0x03 | dictionary id | zstd frame of the JSON without its head (see `strip_head`)

0x03 leaves out of the body what the row's own columns hold (span, trace, rollout and attempt ids,
the name): random ids barely compress, and the columns keep them anyway. The head is rebuilt from
the columns on read (`SpanIds`). A body whose head is not in the order the store writes keeps 0x02.

Dictionaries live in the `span_dictionaries` table, named by a hash of their bytes, and every batch
that uses one inserts it if absent in its own transaction (a no-op after the first): a batch that
rolls back can't leave spans pointing at a dictionary that was never committed, and two processes
writing one file can't give one id to two dictionaries. A store builds its first dictionary once
`_DICT_BYTES` of bodies have passed (the spans before it are compressed alone) and a fresh one every
`_REFRESH_SPANS` spans, so the dictionary follows a workload that changes; each is 16 KB.
"""

from __future__ import annotations

import hashlib
import json
import struct
import threading
from collections import deque
from collections.abc import Callable, Sequence
from json.decoder import scanstring  # type: ignore[attr-defined]  # public since 2.6, not in typeshed
from typing import NamedTuple

import zstandard
from sqlalchemy import BigInteger, Column, Integer, LargeBinary, Table

from reinforge.store.sql.schema import metadata

FORMAT_ZSTD = 0x02
FORMAT_ZSTD_HEADLESS = 0x03
_HEADER = struct.Struct(">BQ")
_DICT_BYTES = 16 * 1024
"""How much of the latest spans a dictionary holds."""
_REFRESH_SPANS = 100_000
_LEVEL = 3

span_dictionaries = Table(
    "span_dictionaries",
    metadata,
    # INTEGER on SQLite: the row's own number, with no index of its own (as `schema._Serial`).
    Column("dict_id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=False),
    Column("body", LargeBinary, nullable=False),
)


class SpanIds(NamedTuple):
    """What a span's row holds beside its body: enough to rebuild the head a 0x03 body leaves out."""

    span_id: str
    trace_id: str
    rollout_id: str
    attempt_id: str
    name: str


def strip_head(body: str, ids: SpanIds) -> str | None:
    """The body without the fields `ids` hold, or None when its head is not the one the store writes.

    A span's JSON starts `{"span_id":..,"trace_id":..,"parent_id":P,"rollout_id":..,"attempt_id":..,
    "name":..,` (pydantic's field order, and the ingest fast path's). What is kept is `P` and
    everything after the name, so `with_head` gives back the same values.
    """
    start = f'{{"span_id":"{ids.span_id}","trace_id":"{ids.trace_id}","parent_id":'
    if not body.startswith(start):
        return None
    at = len(start)
    if body.startswith("null", at):
        parent_end = at + 4
    elif body.startswith('"', at):
        try:
            _, parent_end = scanstring(body, at + 1)
        except ValueError:
            return None
        if parent_end != at + 18:  # 16 characters, no escapes: the only shape `with_head` rebuilds
            return None
    else:
        return None
    at = parent_end
    for key, value in (("rollout_id", ids.rollout_id), ("attempt_id", ids.attempt_id), ("name", ids.name)):
        label = f',"{key}":"'
        if not body.startswith(label, at):
            return None
        try:
            found, at = scanstring(body, at + len(label))
        except ValueError:
            return None
        if found != value:
            return None
    if not body.startswith(",", at):
        return None
    return body[len(start) : parent_end] + body[at:]


def with_head(rest: str, ids: SpanIds) -> str:
    """The span's JSON from what `strip_head` kept and the row's columns."""
    parent_end = 4 if rest.startswith("null") else 18
    return "".join(
        (
            f'{{"span_id":"{ids.span_id}","trace_id":"{ids.trace_id}","parent_id":',
            rest[:parent_end],
            ',"rollout_id":',
            json.dumps(ids.rollout_id),
            ',"attempt_id":',
            json.dumps(ids.attempt_id),
            ',"name":',
            json.dumps(ids.name),
            rest[parent_end:],
        )
    )


class SpanBodyCodec:
    """Encodes bodies on the store's single writer; decodes on any thread."""

    def __init__(self) -> None:
        self._recent: deque[bytes] = deque()
        self._recent_bytes = 0
        self._dict: tuple[int, bytes] | None = None
        self._compressor = zstandard.ZstdCompressor(level=_LEVEL, write_checksum=False)
        self._since_dict = 0
        self._dicts: dict[int, zstandard.ZstdCompressionDict] = {}
        self._lock = threading.Lock()
        self._local = threading.local()
        """Per thread: a decompressor per dictionary id (zstandard's objects are not for sharing
        between threads)."""

    def encode_batch(
        self, bodies: Sequence[str], ids: Sequence[SpanIds] | None = None
    ) -> tuple[list[bytes], tuple[int, bytes] | None]:
        """The bodies compressed, and the dictionary (id, bytes) they need stored with them. With
        `ids` (each body's row), a body leaves out its head (format 0x03) when `strip_head` can."""
        out = []
        used: tuple[int, bytes] | None = None
        for i, body in enumerate(bodies):
            rest = None if ids is None else strip_head(body, ids[i])
            fmt = FORMAT_ZSTD if rest is None else FORMAT_ZSTD_HEADLESS
            raw = (body if rest is None else rest).encode()
            self._remember(raw)
            if (
                self._dict is None or self._since_dict >= _REFRESH_SPANS
            ) and self._recent_bytes >= _DICT_BYTES:
                self._new_dictionary()
            self._since_dict += 1
            dict_id = 0
            if self._dict is not None:
                dict_id = self._dict[0]
                used = self._dict
            out.append(_HEADER.pack(fmt, dict_id) + self._compressor.compress(raw))
        return out, used

    def decode(
        self, stored: str | bytes, load_dictionary: Callable[[int], bytes], ids: SpanIds | None = None
    ) -> str:
        """The span's JSON text, from a plain TEXT body or a compressed one (`ids`: its row's, which
        a 0x03 body needs)."""
        fmt, text = self._inflate(stored, load_dictionary)
        if fmt != FORMAT_ZSTD_HEADLESS:
            return text
        if ids is None:
            raise ValueError("a span body without its head needs its row's ids to be read")
        return with_head(text, ids)

    def decode_without_head(self, stored: str | bytes, load_dictionary: Callable[[int], bytes]) -> str:
        """The body's text as stored: the whole JSON, or (0x03) all of it but the head. Enough to
        search the attributes, which are never in the head."""
        return self._inflate(stored, load_dictionary)[1]

    def _inflate(self, stored: str | bytes, load_dictionary: Callable[[int], bytes]) -> tuple[int, str]:
        if isinstance(stored, str):
            return 0, stored
        if len(stored) < _HEADER.size or stored[0] not in (FORMAT_ZSTD, FORMAT_ZSTD_HEADLESS):
            raise ValueError(f"unknown span body format {stored[:1]!r}: written by a newer reinforge?")
        fmt, dict_id = _HEADER.unpack_from(stored)
        decompressors: dict[int, zstandard.ZstdDecompressor] | None = getattr(self._local, "by_dict", None)
        if decompressors is None:
            decompressors = self._local.by_dict = {}
        inflate = decompressors.get(dict_id)
        if inflate is None:
            if dict_id:
                zdict = self._dicts.get(dict_id)
                if zdict is None:
                    zdict = _raw_dictionary(load_dictionary(dict_id))
                    with self._lock:
                        self._dicts[dict_id] = zdict
                inflate = zstandard.ZstdDecompressor(dict_data=zdict)
            else:
                inflate = zstandard.ZstdDecompressor()
            decompressors[dict_id] = inflate
        return int(fmt), inflate.decompress(stored[_HEADER.size :]).decode()

    def _remember(self, raw: bytes) -> None:
        self._recent.append(raw)
        self._recent_bytes += len(raw)
        while self._recent_bytes - len(self._recent[0]) >= _DICT_BYTES:
            self._recent_bytes -= len(self._recent.popleft())

    def _new_dictionary(self) -> None:
        # The latest spans, newest last: the match finder prefers the shortest distance.
        zdict = b"".join(self._recent)[-_DICT_BYTES:]
        # 63 bits: SQLite's INTEGER and PostgreSQL's BIGINT are signed; 0 means "no dictionary".
        dict_id = int.from_bytes(hashlib.blake2b(zdict, digest_size=8).digest()) >> 1 or 1
        self._dict = (dict_id, zdict)
        prepared = _raw_dictionary(zdict)
        prepared.precompute_compress(level=_LEVEL)
        with self._lock:
            self._dicts[dict_id] = prepared
        self._compressor = zstandard.ZstdCompressor(level=_LEVEL, dict_data=prepared, write_checksum=False)
        self._since_dict = 0


def _raw_dictionary(data: bytes) -> zstandard.ZstdCompressionDict:
    """Recent spans used as they are (no trained dictionary: training one would cost more than the
    spans it helps, and the content itself is what repeats)."""
    return zstandard.ZstdCompressionDict(data, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
