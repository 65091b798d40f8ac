"""The runner's finish route: one request records the runner's spans, flushes the attempt's, finishes it."""

from __future__ import annotations

from typing import Any

import httpx

from reinforge import semconv
from reinforge.access import finish_token
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutStatus, Span, SpanQuery

from .conftest import SECRET, Served, running_attempt

MESSAGES = [{"role": "user", "content": "hi"}]


def _finish_headers(attempt_id: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {finish_token(SECRET, attempt_id)}"}


def _reward_span(rollout_id: str, attempt_id: str, value: float) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_FINAL_REWARD,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_REWARD, semconv.ATTR_REWARD_VALUE: value},
    )


def _body(outcome: AttemptOutcome, spans: list[Span] = []) -> dict[str, Any]:  # noqa: B006 (read only)
    return {"outcome": outcome.model_dump(mode="json"), "spans": [s.model_dump(mode="json") for s in spans]}


async def test_finish_stores_the_calls_and_the_runner_spans_then_finishes(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id, rollout_id = leased.attempt.attempt_id, leased.rollout.rollout_id
    await served.client(attempt_id).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    outcome = AttemptOutcome(status=AttemptStatus.succeeded, reward=0.5)
    async with httpx.AsyncClient(base_url=f"{served.url}/r/{attempt_id}") as http:
        reply = await http.post(
            "/finish",
            json=_body(outcome, [_reward_span(rollout_id, attempt_id, 0.5)]),
            headers=_finish_headers(attempt_id),
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["status"] == RolloutStatus.succeeded.value
    # Acknowledged, so every span of the attempt is already stored and the attempt is final.
    spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert sorted(s.name for s in spans) == sorted([semconv.SPAN_LLM_CALL, semconv.SPAN_FINAL_REWARD])
    llm = next(s for s in spans if s.name == semconv.SPAN_LLM_CALL)
    assert llm.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
    attempt = await served.store.get_attempt(attempt_id)
    assert attempt.status is AttemptStatus.succeeded
    rollout = await served.store.get_rollout(rollout_id)
    assert rollout.status is RolloutStatus.succeeded and rollout.reward == 0.5
    # The gateway forgot its cached "running": further calls for the attempt are refused.
    late = await httpx.AsyncClient().post(
        f"{served.url}/r/{attempt_id}/v1/chat/completions",
        json={"model": "m", "messages": MESSAGES},
        headers=served.headers(attempt_id),
    )
    assert late.status_code == 409


async def test_a_succeeded_outcome_without_reward_takes_the_emitted_final_reward(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    async with httpx.AsyncClient(base_url=f"{served.url}/r/{attempt_id}") as http:
        posted = await http.post("/reward", json={"reward": 0.75}, headers=served.headers(attempt_id))
        assert posted.status_code == 200
        reply = await http.post(
            "/finish",
            json=_body(AttemptOutcome(status=AttemptStatus.succeeded)),
            headers=_finish_headers(attempt_id),
        )
    assert reply.status_code == 200, reply.text
    assert reply.json()["reward"] == 0.75
    assert (await served.store.get_attempt(attempt_id)).reward == 0.75


async def test_the_agent_s_own_token_cannot_finish_and_the_finish_token_cannot_call(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    body = _body(AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0))
    async with httpx.AsyncClient(base_url=f"{served.url}/r/{attempt_id}") as http:
        refused = await http.post("/finish", json=body, headers=served.headers(attempt_id))
        assert refused.status_code == 401
        assert "finish token" in refused.json()["error"]["message"]
        assert (await http.post("/finish", json=body)).status_code == 401
        call = await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": MESSAGES},
            headers=_finish_headers(attempt_id),
        )
        assert call.status_code == 401
    assert (await served.store.get_attempt(attempt_id)).status is AttemptStatus.running


async def test_a_late_finish_is_a_409_naming_the_stale_attempt(served: Served) -> None:
    attempt_id = (await running_attempt(served.store)).attempt.attempt_id
    await served.store.finish_attempt(
        attempt_id, AttemptOutcome(status=AttemptStatus.failed, retryable=False)
    )
    async with httpx.AsyncClient(base_url=f"{served.url}/r/{attempt_id}") as http:
        reply = await http.post(
            "/finish",
            json=_body(AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)),
            headers=_finish_headers(attempt_id),
        )
    assert reply.status_code == 409
    assert reply.json()["error"]["code"] == "StaleAttemptError"


async def test_bad_finish_bodies_are_400s(served: Served) -> None:
    leased = await running_attempt(served.store)
    attempt_id = leased.attempt.attempt_id
    other = _reward_span(leased.rollout.rollout_id, "another-attempt", 1.0)
    ok = AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
    async with httpx.AsyncClient(
        base_url=f"{served.url}/r/{attempt_id}", headers=_finish_headers(attempt_id)
    ) as http:
        foreign = await http.post("/finish", json=_body(ok, [other]))
        assert foreign.status_code == 400 and "another-attempt" in foreign.json()["error"]["message"]
        missing = await http.post("/finish", json={"spans": []})
        assert missing.status_code == 400 and missing.json()["error"]["param"] == "outcome"
        bad_status = await http.post("/finish", json={"outcome": {"status": "running"}})
        assert bad_status.status_code == 400
        not_json = await http.post("/finish", content=b"{", headers={"Content-Type": "application/json"})
        assert not_json.status_code == 400
    assert (await served.store.get_attempt(attempt_id)).status is AttemptStatus.running


async def test_finish_many_ends_each_attempt_with_its_own_status(served: Served) -> None:
    """`POST /finish`: every item is judged alone; the good ones are stored even when others fail."""
    good, stray, wrong_token, done = [await running_attempt(served.store) for _ in range(4)]
    await served.client(good.attempt.attempt_id).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
    finished = AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
    await served.gateway.finish_attempt(done.attempt.attempt_id, finished)

    def item(leased: Any, spans: list[Span], token: str | None = None) -> dict[str, Any]:
        attempt_id = leased.attempt.attempt_id
        return {
            "attempt_id": attempt_id,
            "token": token or finish_token(SECRET, attempt_id),
            **_body(AttemptOutcome(status=AttemptStatus.succeeded), spans),
        }

    items = [
        item(good, [_reward_span(good.rollout.rollout_id, good.attempt.attempt_id, 0.75)]),
        item(stray, [_reward_span(stray.rollout.rollout_id, good.attempt.attempt_id, 1.0)]),
        item(wrong_token, [], token="not-the-token"),
        item(done, []),
    ]
    async with httpx.AsyncClient(base_url=served.url) as http:
        reply = await http.post("/finish", json={"items": items})
        assert reply.status_code == 200, reply.text
        results = reply.json()["results"]
        assert [r["status"] for r in results] == [200, 400, 401, 409]
        assert results[1]["error"]["param"] == "spans.0.attempt_id"
        assert results[2]["error"]["code"] == "invalid_api_key"
        assert results[3]["error"]["code"] == "StaleAttemptError"
        # A malformed batch is refused as a whole, naming what is wrong.
        empty = await http.post("/finish", json={"items": []})
        assert empty.status_code == 400 and "items" in empty.text
    # The good item took the emitted reward and has all its spans; the refused ones are untouched.
    assert (await served.store.get_rollout(good.rollout.rollout_id)).reward == 0.75
    spans = (await served.store.query_spans(SpanQuery(attempt_id=good.attempt.attempt_id))).items
    assert sorted(s.name for s in spans) == sorted([semconv.SPAN_LLM_CALL, semconv.SPAN_FINAL_REWARD])
    for leased in (stray, wrong_token):
        assert (await served.store.get_rollout(leased.rollout.rollout_id)).status is RolloutStatus.running
