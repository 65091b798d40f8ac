"""Naming LLM calls after the framework role that made them: parent chain first, then time
containment; explicit names win; overlapping roles of different names stay unnamed and are counted.
And a tool failure recorded both by a framework hook and by the agent's own span is charged once."""

from __future__ import annotations

from credit.span_factory import client_span, llm_span, role_span, rollout, tool_span
from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.credit.roles import join_roles
from reinforge.types import Span


def _names(spans: list[Span], config: CreditConfig | None = None) -> list[str | None]:
    transitions, _ = build_transitions(rollout(), spans, config or CreditConfig())
    return [t.agent_name for t in transitions]


def writer_checker() -> list[Span]:
    """Two nodes one after the other, one LLM call inside each, and a tool error in the writer."""
    return [
        role_span("writer", t=100.0, end=101.0),
        llm_span([1, 2], [10], t=100.2, seq=0),
        tool_span(t=100.5, error=True),
        role_span("checker", t=101.5, end=102.5),
        llm_span([1, 2, 10, 3], [11, 12], t=101.7, seq=1),
    ]


def test_calls_inside_a_role_take_its_name_and_selective_training_keeps_one_role() -> None:
    transitions, metrics = build_transitions(
        rollout(), writer_checker(), CreditConfig(assignment="equal+air")
    )
    assert [t.agent_name for t in transitions] == ["writer", "checker"]
    assert [t.reward_sources["air"] for t in transitions] == [-0.2, 0.0]
    assert (metrics.calls_named_by_role, metrics.calls_role_ambiguous) == (2, 0)

    writer, metrics = build_transitions(rollout(), writer_checker(), CreditConfig(agents=["writer"]))
    assert [(t.agent_name, t.response_ids) for t in writer] == [("writer", [10])]
    assert (metrics.calls_trained, metrics.calls_filtered) == (1, 1)
    assert metrics.as_dict()["credit/calls_named_by_role"] == 2.0


def test_merged_mode_keeps_each_role_s_calls_apart() -> None:
    transitions, metrics = build_transitions(rollout(), writer_checker(), CreditConfig(mode="merged"))
    assert [(t.agent_name, t.num_calls) for t in transitions] == [("writer", 1), ("checker", 1)]
    assert metrics.merged_calls == 0


def test_an_explicit_agent_name_always_wins() -> None:
    spans = [role_span("writer", t=100.0, end=101.0), llm_span([1], [2], t=100.2, agent="solver")]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig())
    assert [t.agent_name for t in transitions] == ["solver"]
    assert metrics.calls_named_by_role == 0


def test_the_parent_chain_names_a_call_before_time_does() -> None:
    # Anthropic's SDK: the gateway's LLM span hangs under `anthropic.messages.create` (traceparent),
    # which hangs under the role, while the call's interval also lies inside another role.
    planner = role_span("planner", t=99.0, end=None)
    create = client_span("anthropic.messages.create", t=100.1, parent_id=planner.span_id)
    spans = [
        planner,
        role_span("writer", t=100.0, end=101.0),
        create,
        llm_span([1], [2], t=100.2, parent_id=create.span_id),
    ]
    assert _names(spans) == ["planner"]


def test_a_call_in_a_nested_role_takes_the_innermost_name() -> None:
    team = role_span("team", t=100.0, end=110.0)
    spans = [
        team,
        role_span("writer", t=101.0, end=105.0, parent_id=team.span_id),
        llm_span([1], [2], t=102.0, seq=0),  # inside both: the writer
        llm_span([1], [3], t=106.0, seq=1),  # inside the team only
    ]
    assert _names(spans) == ["writer", "team"]


def test_overlapping_roles_of_different_names_leave_the_call_unnamed_and_counted() -> None:
    # Parallel branches: neither role is the other's parent, so time alone can't tell whose call it is.
    spans = [
        role_span("search", t=100.0, end=110.0),
        role_span("summarise", t=100.5, end=105.0),
        llm_span([1], [2], t=101.0, seq=0),  # inside both
        llm_span([1], [3], t=106.0, seq=1),  # inside "search" only
    ]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig())
    assert [t.agent_name for t in transitions] == [None, "search"]
    assert (metrics.calls_named_by_role, metrics.calls_role_ambiguous) == (1, 1)
    assert metrics.as_dict()["credit/calls_role_ambiguous"] == 1.0
    # An unnamed call is not trained when only some roles are.
    kept, metrics = build_transitions(rollout(), spans, CreditConfig(agents=["search", "summarise"]))
    assert [t.agent_name for t in kept] == ["search"]


def test_overlapping_roles_of_one_name_are_no_ambiguity() -> None:
    # An AutoGen team's container and the agent itself both open `invoke_agent calc_agent`.
    spans = [
        role_span("calc_agent", t=100.0, end=110.0),
        role_span("calc_agent", t=100.5, end=105.0),
        llm_span([1], [2], t=101.0),
    ]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig())
    assert [t.agent_name for t in transitions] == ["calc_agent"]
    assert metrics.calls_role_ambiguous == 0


def test_a_call_that_outlasts_every_role_or_belongs_to_another_attempt_stays_unnamed() -> None:
    spans = [
        role_span("writer", t=100.0, end=101.0),
        llm_span([1], [2], t=100.9, duration=0.5, seq=0),  # ends after the role did
        role_span("checker", t=99.0, end=103.0, attempt_id="a0"),  # an earlier attempt's role
        llm_span([1], [3], t=102.5, seq=1),
    ]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig())
    assert [t.agent_name for t in transitions] == [None, None]
    assert (metrics.calls_named_by_role, metrics.calls_role_ambiguous) == (0, 0)


def test_a_role_without_a_name_or_an_end_and_a_parent_cycle() -> None:
    unnamed = role_span("x", t=100.0, end=110.0)
    unnamed.attributes.pop(semconv.ATTR_AGENT_NAME)
    open_role = role_span("open", t=99.0, end=None)  # never ended: it holds everything after it
    a = client_span("a", t=100.0, parent_id=None)
    b = client_span("b", t=100.0, parent_id=a.span_id)
    a.parent_id = b.span_id  # a cycle in a broken trace must not hang the join
    call = llm_span([1], [2], t=101.0, parent_id=b.span_id)
    join = join_roles([unnamed, open_role, a, b, call], [call])
    assert (join.names, join.ambiguous) == ({call.span_id: "open"}, 0)


def _framework_tool(t: float, end: float) -> Span:
    step = tool_span(t=t, error=True)
    step.attributes[semconv.ATTR_FRAMEWORK] = "langchain"
    step.end_time = end
    return step


def test_a_tool_error_recorded_by_the_hook_and_by_the_agent_s_own_span_counts_once() -> None:
    spans = [
        llm_span([1], [2], t=100.0, seq=0),
        _framework_tool(100.2, 100.6),
        tool_span(t=100.3, error=True),  # the agent's own `reinforge.span(kind="tool")` inside it
        _framework_tool(100.25, 100.5),  # a parallel tool call of the same turn: its own failure
        llm_span([1, 2, 3], [4], t=101.0, seq=1),
        tool_span(t=101.2, error=True),  # a failure only the agent's span saw
    ]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig(assignment="equal+air"))
    assert metrics.air_signals == {semconv.AIR_TOOL_ERROR: 3}
    assert [t.reward_sources["air"] for t in transitions] == [-0.4, -0.2]
