"""OTLP/HTTP on the wire: its two encodings (binary protobuf and OTLP/JSON), gzip, and its answers.

OTLP/JSON is protobuf's JSON mapping except for one thing that matters here: trace and span ids are
hex, not base64. They are rewritten as base64 first, so protobuf's own parser reads both encodings
into the same `ExportTraceServiceRequest`. Answers follow the OTLP spec rather than the gateway's
OpenAI-shaped errors, since OpenTelemetry exporters are what read them: a success is an
`ExportTraceServiceResponse` and a failure a `google.rpc.Status`, each in the request's encoding.
"""

from __future__ import annotations

import base64
import binascii
import re
import zlib
from enum import Enum
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from starlette.responses import Response

from reinforge.gateway.errors import GatewayHTTPError
from reinforge.json_codec import dumps, loads


class Encoding(str, Enum):
    protobuf = "application/x-protobuf"
    json = "application/json"


_GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 10, 413: 8, 415: 3, 429: 8, 503: 14}
"""HTTP status → google.rpc.Code (INVALID_ARGUMENT, UNAUTHENTICATED, ...); anything else is INTERNAL."""
_INTERNAL = 13

_ID_FIELDS = {
    "traceId": 16, "trace_id": 16, "spanId": 8, "span_id": 8, "parentSpanId": 8, "parent_span_id": 8,
}  # fmt: skip
_HEX = re.compile(r"[0-9a-fA-F]*")
_BAD_ID = base64.b64encode(b"\x00").decode()
"""What an id that is neither hex nor base64 becomes: one byte, which the span check refuses."""


def encoding_of(content_type: str | None) -> Encoding | None:
    """The encoding a Content-Type names, or None when it is neither of OTLP's."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    if media in ("application/x-protobuf", "application/protobuf"):
        return Encoding.protobuf
    if media == "application/json":
        return Encoding.json
    return None


def decode_request(
    body: bytes, encoding: Encoding, content_encoding: str | None, max_bytes: int
) -> ExportTraceServiceRequest:
    """The request, or a 400 (malformed), 413 (too large once decompressed) or 415 (unknown coding)."""
    coding = (content_encoding or "identity").strip().lower()
    if coding in ("gzip", "x-gzip"):
        body = _gunzip(body, max_bytes)
    elif coding != "identity":
        raise GatewayHTTPError(415, f"unsupported Content-Encoding {content_encoding!r}; send gzip or none")
    if len(body) > max_bytes:
        raise GatewayHTTPError(413, f"the trace data is {len(body)} bytes; the limit is {max_bytes}")
    if encoding is Encoding.protobuf:
        try:
            return ExportTraceServiceRequest.FromString(body)
        except (DecodeError, ValueError, RecursionError) as exc:
            raise GatewayHTTPError(
                400, f"the body is not a protobuf ExportTraceServiceRequest: {exc}"
            ) from None
    return _from_json(body)


def _gunzip(body: bytes, max_bytes: int) -> bytes:
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, max_bytes + 1)
    except zlib.error as exc:
        raise GatewayHTTPError(400, f"the body is not valid gzip: {exc}") from None
    if len(out) > max_bytes:
        raise GatewayHTTPError(413, f"the trace data decompresses to more than {max_bytes} bytes")
    if not inflater.eof or inflater.unused_data:
        raise GatewayHTTPError(400, "the body is not valid gzip: truncated, or data after its end")
    return out


def _from_json(body: bytes) -> ExportTraceServiceRequest:
    try:
        data = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise GatewayHTTPError(400, f"the body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise GatewayHTTPError(400, "the body must be a JSON object (an OTLP ExportTraceServiceRequest)")
    for span in _json_spans(data):
        _ids_to_base64(span)
        for link in _items(span, "links"):
            _ids_to_base64(link)
    try:
        return json_format.ParseDict(data, ExportTraceServiceRequest(), ignore_unknown_fields=True)
    except (json_format.Error, ValueError, TypeError, RecursionError) as exc:
        raise GatewayHTTPError(
            400, f"the body is not an OTLP/JSON ExportTraceServiceRequest: {exc}"
        ) from None


def _items(node: Any, *keys: str) -> list[Any]:
    """The list at the first of `keys` in `node` (dicts only); malformed shapes are the parser's to refuse."""
    if isinstance(node, dict):
        for key in keys:
            value = node.get(key)
            if isinstance(value, list):
                return [item for item in value if isinstance(item, dict)]
    return []


def _json_spans(data: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        span
        for resource in _items(data, "resourceSpans", "resource_spans")
        for scope in _items(resource, "scopeSpans", "scope_spans")
        for span in _items(scope, "spans")
    ]


def _ids_to_base64(node: dict[str, Any]) -> None:
    for key, size in _ID_FIELDS.items():
        value = node.get(key)
        if isinstance(value, str) and value:
            node[key] = _id_base64(value, size)


def _id_base64(value: str, size: int) -> str:
    """A hex id (OTLP/JSON) as base64 (protobuf's JSON); base64 of the right size is let through."""
    if len(value) == 2 * size and _HEX.fullmatch(value):
        return base64.b64encode(bytes.fromhex(value)).decode()
    try:
        if len(base64.b64decode(value, validate=True)) == size:
            return value
    except (binascii.Error, ValueError):
        pass
    return _BAD_ID


def export_response(encoding: Encoding, rejected: int, message: str) -> Response:
    """200 with an ExportTraceServiceResponse; `partial_success` says how many spans were refused."""
    answer = ExportTraceServiceResponse()
    if rejected:
        answer.partial_success.rejected_spans = rejected
        answer.partial_success.error_message = message
    if encoding is Encoding.json:
        return Response(dumps(json_format.MessageToDict(answer)), media_type=encoding.value)
    return Response(answer.SerializeToString(), media_type=encoding.value)


def status_response(encoding: Encoding, status: int, message: str) -> Response:
    """A failure: HTTP `status` with a `google.rpc.Status` body in the request's encoding."""
    code = _GRPC_CODES.get(status, _INTERNAL)
    if encoding is Encoding.json:
        body = dumps({"code": code, "message": message})
    else:
        text = message.encode()
        body = b"\x08" + _varint(code) + b"\x12" + _varint(len(text)) + text  # fields 1 (code), 2 (message)
    return Response(body, status_code=status, media_type=encoding.value)


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)
