"""The runner's gateway client against the real mounted gateway: finish, late finish, flush, errors."""

from __future__ import annotations

import pytest

from reinforge import semconv
from reinforge.errors import InvalidRequestError, NotFoundError, StaleAttemptError, StoreUnavailableError
from reinforge.runner.gateway_client import GatewayClient, _error
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutStatus, Span, SpanQuery

from .conftest import GATEWAY_SECRET, Stack, enqueue


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
