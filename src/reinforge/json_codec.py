"""JSON to and from bytes, by msgspec where it can and `json` where it can't.

Every HTTP body the gateway, the store and their clients write or read on a hot path goes through
these two functions, so the fallbacks (NaN, huge integers) behave the same everywhere.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def dumps(data: Any) -> bytes:
    """Compact UTF-8 JSON, by msgspec: several times faster than `json` for a response body.

    Unlike `json`, a NaN or infinite float comes out as null (JSON has no literal for it; `json`'s
    `NaN`/`-Infinity` break strict parsers such as JavaScript's `JSON.parse`).
    """
    try:
        return _ENCODER.encode(data)
    except (TypeError, OverflowError, ValueError):
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()


def loads(raw: bytes) -> Any:
    """JSON from bytes, by msgspec; what msgspec refuses (NaN literals, integers past 64 bits) goes
    to `json`, so every document `json` reads is still read, and `json` words the errors."""
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        return json.loads(raw)
