"""`POST /r/{attempt_id}/v1/traces`: an attempt's OpenTelemetry traces, received over OTLP/HTTP.

Why on the gateway: an agent in any language can already export OpenTelemetry. Pointed here (the
runner sets `OTEL_EXPORTER_OTLP_TRACES_*` for command agents), its spans are stored under the
attempt its URL names, through the same recorder as the attempt's LLM calls, so they are in the store
before the attempt is finished. The key is the attempt's own, as for its LLM calls. Caps per request
and per attempt keep one attempt's flood from costing the other attempts more than its own share:
what is over them is refused and reported as rejected spans, and logged once per attempt. While the
recorder's queue is busy, a request waits for its own spans to be written rather than taking the room
the other attempts' LLM calls need.
"""

from __future__ import annotations

import asyncio
import functools
import logging

from starlette.responses import Response

from reinforge._headers import bearer_token
from reinforge.errors import ReinforgeError
from reinforge.gateway.attempts import AttemptState
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.finishing import note_reported_rewards
from reinforge.gateway.otlp import Converted, OtlpLimits, to_spans
from reinforge.gateway.otlp_wire import (
    Encoding,
    decode_request,
    encoding_of,
    export_response,
    status_response,
)
from reinforge.gateway.service import Gateway
from reinforge.net.routes import RouteRequest
from reinforge.semconv import ATTR_SEQUENCE_IN_ATTEMPT
from reinforge.types import Span

log = logging.getLogger(__name__)

TRACES_PATH = "/r/{attempt_id}/v1/traces"

_ACCEPTED = "otlp.accepted_spans"
"""`AttemptState.extra` key: spans this attempt has had accepted so far."""
_WARNED = "otlp.warned"
_THREAD_BYTES = 64 * 1024
"""Bodies larger than this are decoded off the event loop, so that a big one does not hold up the
other attempts' calls while it is parsed."""


def _decode(
    body: bytes,
    encoding: Encoding,
    content_encoding: str | None,
    state: AttemptState,
    limits: OtlpLimits,
    budget: int,
) -> Converted:
    request = decode_request(body, encoding, content_encoding, limits.max_body_bytes)
    return to_spans(
        request, rollout_id=state.rollout_id, attempt_id=state.attempt_id, limits=limits, budget=budget
    )


class OtlpReceiver:
    """The route's handler, over one `Gateway`."""

    def __init__(self, gateway: Gateway, limits: OtlpLimits | None = None) -> None:
        self.g = gateway
        self.limits = limits or OtlpLimits()

    async def receive(self, request: RouteRequest) -> Response:
        answer_in = encoding_of(request.header(b"content-type")) or Encoding.protobuf
        try:
            return await self._receive(request)
        except ReinforgeError as exc:
            return status_response(answer_in, exc.http_status, str(exc) or type(exc).__name__)

    async def _receive(self, request: RouteRequest) -> Response:
        limits = self.limits
        token = bearer_token(request.header(b"authorization"))
        state = (await self.g.admit(request.path_params["attempt_id"], token)).state
        content_type = request.header(b"content-type")
        encoding = encoding_of(content_type)
        if encoding is None:
            raise GatewayHTTPError(
                415,
                f"unsupported Content-Type {content_type!r}; send application/x-protobuf or application/json",
            )
        budget = max(0, min(limits.max_spans_per_request, limits.max_spans_per_attempt - _accepted(state)))
        decode = functools.partial(
            _decode, request.body, encoding, request.header(b"content-encoding"), state, limits, budget
        )
        converted = await asyncio.to_thread(decode) if len(request.body) > _THREAD_BYTES else decode()

        spans = converted.spans
        room = max(0, limits.max_spans_per_attempt - _accepted(state))  # other requests may have used it
        over = converted.over_budget + max(0, len(spans) - room)
        del spans[room:]
        state.extra[_ACCEPTED] = _accepted(state) + len(spans)
        await self._record(state, spans)

        reasons = list(converted.reasons)
        if over:
            attempt_cap = _accepted(state) >= limits.max_spans_per_attempt
            cap = (
                f"this attempt's cap of {limits.max_spans_per_attempt} spans"
                if attempt_cap
                else f"the cap of {limits.max_spans_per_request} spans per request"
            )
            reasons.insert(0, f"{over} spans over {cap}")
        rejected = converted.invalid + over
        message = "; ".join(reasons)
        if rejected and not state.extra.get(_WARNED):
            state.extra[_WARNED] = True
            log.warning(
                "attempt %s: %d OTLP spans refused (%s); further refusals for it are not logged",
                state.attempt_id,
                rejected,
                message,
            )
        return export_response(encoding, rejected, message)

    async def _record(self, state: AttemptState, spans: list[Span]) -> None:
        """Stamp the attempt's order (by start time, whatever order they came in) and queue them."""
        recorder = self.g.recorder
        spans.sort(key=lambda span: span.start_time)
        note_reported_rewards(state, spans)  # an OTLP agent's final reward counts as a report
        for span in spans:
            span.attributes[ATTR_SEQUENCE_IN_ATTEMPT] = state.take_sequence()
        for span in spans:
            if recorder.queued >= self.limits.max_queued_spans:
                await recorder.flush(state.attempt_id)  # wait for our own, not for room meant for calls
            await recorder.record(span)


def _accepted(state: AttemptState) -> int:
    count = state.extra.get(_ACCEPTED, 0)
    return count if isinstance(count, int) else 0
