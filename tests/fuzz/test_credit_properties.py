"""Hypothesis properties of the transition builder (`credit/`) on spans as anything may write them:
an agent's own spans and OTLP telemetry share the attempt with the gateway's LLM spans, so the
builder must read whatever the store holds without crashing, and train only on the gateway's calls."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.errors import ReinforgeError
from reinforge.types import Rollout, RolloutStatus, Span

PROPERTIES = settings(max_examples=60, deadline=None, derandomize=True, database=None)

junk = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 600),
    st.floats(allow_nan=False),
    st.text(max_size=5),
    st.lists(st.one_of(st.integers(-5, 600), st.floats(allow_nan=False), st.text(max_size=2)), max_size=5),
    st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
)
token_ids = st.lists(st.integers(0, 500), min_size=1, max_size=6)
KEYS = [
    semconv.ATTR_STEP_KIND,
    semconv.ATTR_PROMPT_TOKEN_IDS,
    semconv.ATTR_COMPLETION_TOKEN_IDS,
    semconv.ATTR_COMPLETION_LOGPROBS,
    semconv.ATTR_POLICY_VERSION,
    semconv.ATTR_SEQUENCE_IN_ATTEMPT,
    semconv.ATTR_REWARD_VALUE,
    semconv.ATTR_AGENT_NAME,
]


@st.composite
def spans(draw: st.DrawFn, index: int) -> Span:
    """A span of attempt a1: a well-formed LLM call, or anything with reinforge's keys in it."""
    if draw(st.booleans()):
        prompt, completion = draw(token_ids), draw(token_ids)
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
            semconv.ATTR_PROMPT_TOKEN_IDS: prompt,
            semconv.ATTR_COMPLETION_TOKEN_IDS: completion,
            semconv.ATTR_COMPLETION_LOGPROBS: [-0.5] * len(completion),
            semconv.ATTR_POLICY_VERSION: 0,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: index,
        }
        name = semconv.SPAN_LLM_CALL
    else:
        attributes = draw(st.dictionaries(st.sampled_from(KEYS), junk, max_size=6))
        name = draw(st.sampled_from([semconv.SPAN_LLM_CALL, semconv.SPAN_FINAL_REWARD, "tool", "agent"]))
    return Span(
        rollout_id="r1",
        attempt_id="a1",
        name=name,
        start_time=float(index),
        end_time=index + 0.5,
        attributes=attributes,
    )


episodes = st.integers(0, 6).flatmap(lambda n: st.tuples(*(spans(i) for i in range(n))))


@PROPERTIES
@given(found=episodes, mode=st.sampled_from(["per_call", "merged"]), reward=st.floats(-1, 1))
def test_any_spans_build_transitions_or_a_typed_error(
    found: tuple[Span, ...], mode: str, reward: float
) -> None:
    rollout = Rollout(rollout_id="r1", status=RolloutStatus.succeeded, reward=reward, group_id="g")
    try:
        transitions, _ = build_transitions(rollout, list(found), CreditConfig(mode=mode))
    except ReinforgeError:
        return  # refused with a message: acceptable; a TypeError or KeyError is not
    for transition in transitions:
        assert (
            len(transition.response_ids)
            == len(transition.response_mask)
            == len(transition.behaviour_logprobs)
        )
        assert transition.response_ids and all(isinstance(t, int) for t in transition.response_ids)
