"""The run decides how every call is sampled: through the real gateway over HTTP, each route (chat,
completions, responses, Anthropic messages, each plain and streamed) reaches the backend with the
run's temperature, top-p and top-k for the phase, the agent's max_tokens capped under the run's,
and the span records both what was asked and what was applied. A run that leaves sampling to the
agent, or publishes none, gets each call sampled as it asks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.inference import ScriptedBackend
from reinforge.inference.contract import GenerationRequest, SamplingParams
from reinforge.inference.run_sampling import SAMPLING_RESOURCE, RunSampling
from reinforge.types import RolloutSpec, SpanQuery

from .conftest import SECRET, Served, serve

TRAIN = RunSampling(temperature=0.7, top_p=0.9, top_k=20, max_tokens=48)
GREEDY = RunSampling(temperature=0.0, top_p=0.9, top_k=20, max_tokens=48)


@pytest.fixture
def seen(tokenizer: Any) -> Iterator[tuple[Served, list[SamplingParams]]]:
    """A gateway whose scripted backend keeps the sampling of every request it is given."""
    received: list[SamplingParams] = []

    def reply(request: GenerationRequest) -> str:
        received.append(request.sampling)
        return "The answer is 5."

    yield from ((served, received) for served in serve(ScriptedBackend(tokenizer, reply)))


async def attempt_of_run(served: Served, sampling: RunSampling | None) -> str:
    """A running attempt of a rollout enqueued with `sampling` as its resources (or none)."""
    version = None
    if sampling is not None:
        version = (await served.store.put_resources({SAMPLING_RESOURCE: sampling.resource()})).version
    await served.store.enqueue_rollouts([RolloutSpec(task={"q": "2+3"}, resources_version=version)])
    [leased] = await served.store.lease_rollouts("test-runner", max_rollouts=1)
    return leased.attempt.attempt_id


async def every_route(served: Served, attempt_id: str) -> list[str]:
    """One call per route and mode, each asking for its own sampling (or none); their endpoints."""
    openai_sdk = served.client(attempt_id)
    messages: Any = [{"role": "user", "content": "What is 2+3?"}]
    await openai_sdk.chat.completions.create(
        model="m", messages=messages, temperature=1.3, top_p=0.5, max_tokens=5
    )
    stream = await openai_sdk.chat.completions.create(model="m", messages=messages, stream=True)
    async for _ in stream:
        pass
    await openai_sdk.completions.create(model="m", prompt="What is 2+3?", temperature=0.2, max_tokens=100)
    await openai_sdk.responses.create(model="m", input="What is 2+3?", temperature=1.9, max_output_tokens=30)
    async with anthropic.AsyncAnthropic(
        base_url=f"{served.url}/r/{attempt_id}", api_key=attempt_token(SECRET, attempt_id), max_retries=0
    ) as claude:
        await claude.messages.create(model="m", max_tokens=64, messages=messages, extra_body={"top_k": 3})
        async with claude.messages.stream(
            model="m", max_tokens=9, messages=messages, extra_body={"temperature": 0.0}
        ) as s:
            await s.get_final_message()
    await openai_sdk.close()
    return ["chat", "chat stream", "completions", "responses", "messages", "messages stream"]


ASKED = [  # (temperature, top_p, top_k, max_tokens) each route's call asked for, in order
    (1.3, 0.5, 0, 5),
    (1.0, 1.0, 0, None),
    (0.2, 1.0, 0, 100),
    (1.9, 1.0, 0, 30),
    (1.0, 1.0, 3, 64),
    (0.0, 1.0, 0, 9),
]


def summary(sampling: SamplingParams) -> tuple[float, float, int, int | None]:
    return (sampling.temperature, sampling.top_p, sampling.top_k, sampling.max_tokens)


async def llm_spans(served: Served, attempt_id: str) -> list[dict[str, Any]]:
    await served.gateway.flush(attempt_id)
    page = await served.store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL))
    return [
        s.attributes for s in sorted(page.items, key=lambda s: s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT])
    ]


def as_dict(values: tuple[float, float, int, int | None]) -> dict[str, Any]:
    return dict(zip(("temperature", "top_p", "top_k", "max_tokens"), values, strict=True))


@pytest.mark.parametrize(("run", "expected"), [(TRAIN, (0.7, 0.9, 20)), (GREEDY, (0.0, 1.0, 0))])
async def test_the_run_samples_every_route_as_it_says(
    seen: tuple[Served, list[SamplingParams]], run: RunSampling, expected: tuple[float, float, int]
) -> None:
    served, received = seen
    attempt_id = await attempt_of_run(served, run)
    routes = await every_route(served, attempt_id)
    # The run's temperature, top-p, top-k; the agent's max_tokens kept as a cap under the run's 48.
    caps = [5, 48, 48, 30, 48, 9]
    applied = [(*expected, cap) for cap in caps]
    assert [summary(s) for s in received] == applied, routes
    spans = await llm_spans(served, attempt_id)
    assert [s[semconv.ATTR_SAMPLING_OWNER] for s in spans] == ["run"] * len(routes)
    assert [s[semconv.ATTR_SAMPLING_APPLIED] for s in spans] == [as_dict(a) for a in applied]
    # What each call asked for, as parsed from its body.
    assert [s[semconv.ATTR_SAMPLING_ASKED] for s in spans] == [as_dict(a) for a in ASKED]


@pytest.mark.parametrize("run", [TRAIN.model_copy(update={"owner": "agent"}), None])
async def test_a_run_that_leaves_sampling_to_the_agent_honours_each_call(
    seen: tuple[Served, list[SamplingParams]], run: RunSampling | None
) -> None:
    served, received = seen
    attempt_id = await attempt_of_run(served, run)
    await every_route(served, attempt_id)
    assert [summary(s) for s in received] == ASKED
    spans = await llm_spans(served, attempt_id)
    assert {s[semconv.ATTR_SAMPLING_OWNER] for s in spans} == {"agent"}
    assert [s[semconv.ATTR_SAMPLING_APPLIED] for s in spans] == [as_dict(a) for a in ASKED]


def test_run_sampling_keeps_the_calls_own_stops_seed_and_shaping() -> None:
    asked = SamplingParams(
        temperature=1.4, max_tokens=200, stop=["\n"], seed=7, presence_penalty=0.5, logit_bias={3: 1.0}
    )
    applied = TRAIN.apply(asked)
    assert (applied.temperature, applied.top_p, applied.top_k, applied.max_tokens) == (0.7, 0.9, 20, 48)
    assert (applied.stop, applied.seed, applied.presence_penalty, applied.logit_bias) == (
        ["\n"],
        7,
        0.5,
        {3: 1.0},
    )
    # Nothing to change: the same object (no copy on the hot path).
    assert TRAIN.apply(applied) is applied
    assert RunSampling(max_tokens=None).apply(SamplingParams()).max_tokens is None
