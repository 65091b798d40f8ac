"""The runner's gateway client against the real mounted gateway: finish, late finish, flush, errors."""

from __future__ import annotations

import asyncio
from types import ModuleType
from typing import Any

import pytest

from reinforge import semconv
from reinforge.access import attempt_token, finish_token
from reinforge.errors import InvalidRequestError, NotFoundError, StaleAttemptError, StoreUnavailableError
from reinforge.net.keepalive_transport import KeepAliveTransport
from reinforge.runner.gateway_client import GatewayClient, _error
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutStatus, Span, SpanQuery

from .conftest import GATEWAY_SECRET, Stack, enqueue


class _Watched(KeepAliveTransport):
    """A keep-alive transport that notes the path of each request it sends (the gateway's prefix off)."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    async def send_wire(
        self, mod: ModuleType, pool: Any, host: str, port: int, wire: bytes, request: Any
    ) -> Any:
        self.paths.append(wire.split(b" ", 2)[1].decode().removeprefix("/gateway"))
        return await super().send_wire(mod, pool, host, port, wire, request)


async def test_finish_then_a_second_finish_is_stale(stack: Stack) -> None:
    (rollout,) = await enqueue(stack.store, {})
    (leased,) = await stack.store.lease_rollouts("r", 1)
    attempt_id = leased.attempt.attempt_id
    span = Span(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_FINAL_REWARD,
        attributes={semconv.ATTR_REWARD_VALUE: 1.0},
    )
    client = GatewayClient(stack.gateway_url, GATEWAY_SECRET)
    try:
        await client.flush(attempt_id)
        await client.finish(attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0), [span])
        assert (await stack.store.get_rollout(rollout.rollout_id)).status is RolloutStatus.succeeded
        assert (await stack.store.query_spans(SpanQuery(attempt_id=attempt_id))).total == 1
        with pytest.raises(StaleAttemptError):
            await client.finish(attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0))
        with pytest.raises(NotFoundError):
            await client.finish("no-such-attempt", AttemptOutcome(status=AttemptStatus.failed))
    finally:
        await client.aclose()


async def test_wrong_secret_and_unreachable_gateway() -> None:
    client = GatewayClient("http://127.0.0.1:9/gateway", GATEWAY_SECRET, timeout_s=2.0)
    with pytest.raises(StoreUnavailableError):
        await client.finish("a1", AttemptOutcome(status=AttemptStatus.failed))
    await client.aclose()


def test_error_bodies_map_to_typed_errors() -> None:
    def body(code: str | None) -> bytes:
        return b'{"error": {"message": "m", "code": %s}}' % (b'"%s"' % code.encode() if code else b"null")

    assert isinstance(_error(409, body("StaleAttemptError"), "x"), StaleAttemptError)
    assert isinstance(_error(404, body("NotFoundError"), "x"), NotFoundError)
    assert isinstance(_error(503, body(None), "x"), StoreUnavailableError)
    assert isinstance(_error(502, b"<html>bad gateway</html>", "x"), StoreUnavailableError)
    refused = _error(401, body("invalid_api_key"), "gateway finish")
    assert isinstance(refused, InvalidRequestError) and "401: m" in str(refused)
    assert isinstance(_error(404, b"not found", "x"), InvalidRequestError)  # no such route


async def test_finishes_that_queue_up_go_out_in_one_request(stack: Stack) -> None:
    rollouts = await enqueue(stack.store, *({"i": i} for i in range(12)))
    leased = await stack.store.lease_rollouts("r", 12)
    watched = _Watched()
    sent = watched.paths
    client = GatewayClient(stack.gateway_url, GATEWAY_SECRET, transport=watched)
    try:
        lone = leased[0].attempt.attempt_id
        await client.finish(lone, AttemptOutcome(status=AttemptStatus.succeeded, reward=0.0))
        assert sent == [f"/r/{lone}/finish"]  # a finish with nothing queued goes out alone, at once

        async def finish(i: int) -> None:
            lr = leased[i]
            span = Span(
                rollout_id=lr.rollout.rollout_id,
                attempt_id=lr.attempt.attempt_id,
                name=semconv.SPAN_FINAL_REWARD,
                attributes={semconv.ATTR_REWARD_VALUE: i / 10},
            )
            await client.finish(lr.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded), [span])

        await asyncio.gather(*(finish(i) for i in range(1, 12)))
        assert sent[1:] == ["/finish"]  # eleven finishes, one request
        by_id = {
            r.rollout_id: r for r in await stack.store.wait_for_rollouts([r.rollout_id for r in rollouts], 5)
        }
        for i, lr in enumerate(leased):
            final = by_id[lr.rollout.rollout_id]
            assert final.status is RolloutStatus.succeeded
            assert final.reward == pytest.approx(i / 10)
    finally:
        await client.aclose()


async def test_a_refused_finish_in_a_batch_fails_only_its_caller(stack: Stack) -> None:
    await enqueue(stack.store, {"a": 1}, {"b": 2})
    first, second = await stack.store.lease_rollouts("r", 2)
    client = GatewayClient(stack.gateway_url, GATEWAY_SECRET)
    ok = AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
    try:
        await client.finish(second.attempt.attempt_id, ok)
        results = await asyncio.gather(
            client.finish(first.attempt.attempt_id, ok),
            client.finish(second.attempt.attempt_id, ok),  # finished already: stale
            client.finish("no-such-attempt", ok),
            return_exceptions=True,
        )
        assert results[0] is None
        assert isinstance(results[1], StaleAttemptError)
        assert isinstance(results[2], NotFoundError)
        assert (await stack.store.get_rollout(first.rollout.rollout_id)).status is RolloutStatus.succeeded
    finally:
        await client.aclose()


async def test_requests_carry_the_finish_and_attempt_tokens() -> None:
    """What goes on the wire: the path under the gateway's prefix, the signed token, the body."""
    seen: list[bytes] = []

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                seen.append(head + await reader.readexactly(length))
            except (asyncio.IncompleteReadError, ConnectionError):
                return
            if head.split(b" ")[1].endswith(b"/flush"):
                body = b'{"error": {"message": "store down", "code": null}}'
                writer.write(b"HTTP/1.1 503 Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
            else:
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
            await writer.drain()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = GatewayClient(f"http://127.0.0.1:{port}/gateway", GATEWAY_SECRET)
    try:
        await client.finish("a/1", AttemptOutcome(status=AttemptStatus.failed))
        with pytest.raises(StoreUnavailableError, match="503: store down"):
            await client.flush("a/1")
    finally:
        await client.aclose()
        server.close()
    finish, flush = (request.partition(b"\r\n\r\n") for request in seen)
    assert finish[0].split(b"\r\n")[0] == b"POST /gateway/r/a%2F1/finish HTTP/1.1"
    assert f"Authorization: Bearer {finish_token(GATEWAY_SECRET, 'a/1')}".encode() in finish[0]
    assert finish[2].startswith(b'{"outcome":{"status":"failed"')
    assert finish[2].endswith(b',"spans":[]}')
    assert f"Authorization: Bearer {attempt_token(GATEWAY_SECRET, 'a/1')}".encode() in flush[0]


async def test_queued_finishes_fail_cleanly_when_the_gateway_is_gone() -> None:
    client = GatewayClient("http://127.0.0.1:9/gateway", GATEWAY_SECRET, timeout_s=2.0)
    failed = AttemptOutcome(status=AttemptStatus.failed)
    results = await asyncio.gather(
        *(client.finish(f"a{i}", failed) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, StoreUnavailableError) for r in results)
    await client.aclose()
