"""build_transitions on span sets shaped like a real calc episode: question → tool call → result →
tool call → result → answer, with token ids chosen so the expected samples can be written by hand."""

from __future__ import annotations

import logging

import pytest

from credit.span_factory import llm_span, reward_span, rollout, signal_span, tool_span
from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.errors import InvalidRequestError
from reinforge.types import Attempt, AttemptStatus, RolloutStatus, Span

P1, R1, G1 = [1, 2, 3], [10, 11], [20]
P2 = P1 + R1 + G1
R2, G2 = [12, 13], [21, 22]
P3 = P2 + R2 + G2
R3 = [14]


def episode(attempt_id: str = "a1", t0: float = 100.0, rollout_id: str = "r1") -> list[Span]:
    return [
        llm_span(P1, R1, t=t0, attempt_id=attempt_id, rollout_id=rollout_id, logprobs=[-0.1, -0.2], seq=0),
        llm_span(
            P2, R2, t=t0 + 1, attempt_id=attempt_id, rollout_id=rollout_id, logprobs=[-0.3, -0.4], seq=1
        ),
        llm_span(P3, R3, t=t0 + 2, attempt_id=attempt_id, rollout_id=rollout_id, logprobs=[-0.5], seq=2),
    ]


def test_per_call_gives_one_transition_per_llm_call() -> None:
    transitions, metrics = build_transitions(rollout(reward=1.0), episode(), CreditConfig())
    assert [t.prompt_ids for t in transitions] == [P1, P2, P3]
    assert [t.response_ids for t in transitions] == [R1, R2, R3]
    assert [t.response_mask for t in transitions] == [[1, 1], [1, 1], [1]]
    assert [t.behaviour_logprobs for t in transitions] == [[-0.1, -0.2], [-0.3, -0.4], [-0.5]]
    assert [t.index for t in transitions] == [0, 1, 2]
    assert [t.reward for t in transitions] == [1.0, 1.0, 1.0]
    assert all(t.reward_sources == {"equal": 1.0} and t.final_reward == 1.0 for t in transitions)
    assert all(t.group_id == "g1" and t.task_id == "t1" and t.attempt_id == "a1" for t in transitions)
    assert (metrics.calls, metrics.transitions, metrics.trained_tokens, metrics.masked_tokens) == (3, 3, 5, 0)


def test_merged_mode_joins_exact_prefix_extensions_and_masks_tool_results() -> None:
    transitions, metrics = build_transitions(rollout(), episode(), CreditConfig(mode="merged"))
    assert len(transitions) == 1
    (t,) = transitions
    assert t.prompt_ids == P1
    assert t.response_ids == [10, 11, 20, 12, 13, 21, 22, 14]
    assert t.response_mask == [1, 1, 0, 1, 1, 0, 0, 1]
    assert t.behaviour_logprobs == [-0.1, -0.2, 0.0, -0.3, -0.4, 0.0, 0.0, -0.5]
    assert t.num_calls == 3
    assert (metrics.merged_calls, metrics.merge_mismatches) == (2, 0)
    assert (metrics.trained_tokens, metrics.masked_tokens, metrics.prompt_tokens) == (5, 3, 3)
    assert metrics.as_dict()["credit/merge_rate"] == 1.0


def test_merged_mode_falls_back_when_the_history_was_retokenised() -> None:
    spans = episode()
    # The third prompt renders the second response differently (13 became 99): not an extension.
    spans[2] = llm_span([*P2, 12, 99, *G2], R3, t=102.0, seq=2)
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig(mode="merged"))
    assert [t.num_calls for t in transitions] == [2, 1]
    assert transitions[1].prompt_ids == [*P2, 12, 99, *G2]
    assert [t.index for t in transitions] == [0, 1]
    assert (metrics.merged_calls, metrics.merge_mismatches) == (1, 1)


def test_a_merge_mismatch_is_logged_with_where_the_prompt_diverged(caplog: pytest.LogCaptureFixture) -> None:
    spans = episode()
    spans[2] = llm_span([*P2, 12, 99, *G2], R3, t=102.0, seq=2)
    caplog.set_level(logging.DEBUG, logger="reinforge.credit.merge")
    build_transitions(rollout(), spans, CreditConfig(mode="merged"))
    (record,) = [r for r in caplog.records if "merge mismatch" in r.getMessage()]
    # History P2 + R2 = [1, 2, 3, 10, 11, 20, 12, 13]; the prompt has 99 where 13 was (index 7).
    assert "diverges at token 7 (response/gap) of a 8-token history" in record.getMessage()
    assert "history [1, 2, 3, 10, 11, 20, 12, 13]" in record.getMessage()
    assert "prompt [1, 2, 3, 10, 11, 20, 12, 99, 21, 22]" in record.getMessage()


def test_calls_are_ordered_by_writer_sequence_then_time_then_store_order() -> None:
    spans = episode()
    # Equal timestamps, shuffled input: the per-attempt counter decides.
    same_time = [s.model_copy(update={"start_time": 5.0}) for s in spans]
    transitions, _ = build_transitions(rollout(), list(reversed(same_time)), CreditConfig(mode="merged"))
    assert transitions[0].num_calls == 3
    # Without a writer counter, start time, then the store's arrival order.
    a = llm_span(P1, R1, t=1.0, store_seq=7)
    b = llm_span(P2, R2, t=1.0, store_seq=8)
    transitions, _ = build_transitions(rollout(), [b, a], CreditConfig())
    assert [t.prompt_ids for t in transitions] == [P1, P2]


def test_only_the_final_successful_attempt_is_used() -> None:
    spans = episode("a1", t0=100.0) + episode("a2", t0=200.0)[:2]
    attempts = [
        Attempt(
            attempt_id="a1",
            rollout_id="r1",
            attempt_no=1,
            runner_id="x",
            lease_deadline=0,
            status=AttemptStatus.succeeded,
        ),
        Attempt(
            attempt_id="a2",
            rollout_id="r1",
            attempt_no=2,
            runner_id="x",
            lease_deadline=0,
            status=AttemptStatus.failed,
        ),
    ]
    transitions, _ = build_transitions(rollout(), spans, CreditConfig(), attempts=attempts)
    assert {t.attempt_id for t in transitions} == {"a1"} and len(transitions) == 3
    # Without attempt records, the attempt that started last is the final one.
    transitions, _ = build_transitions(rollout(), spans, CreditConfig())
    assert {t.attempt_id for t in transitions} == {"a2"} and len(transitions) == 2


def test_selective_training_keeps_only_chosen_agents() -> None:
    spans = [
        llm_span(P1, R1, t=1.0, agent="solver"),
        llm_span([7, 8], [9], t=2.0, agent="checker"),
        llm_span(P2, R2, t=3.0, agent="solver"),
    ]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig(agents=["solver"]))
    assert [t.agent_name for t in transitions] == ["solver", "solver"]
    assert [t.index for t in transitions] == [0, 1]
    assert (metrics.calls, metrics.calls_trained, metrics.calls_filtered) == (3, 2, 1)
    # The checker's call sits between the solver's, yet the solver's calls still merge exactly.
    merged, metrics = build_transitions(rollout(), spans, CreditConfig(mode="merged", agents=["solver"]))
    assert len(merged) == 1 and merged[0].num_calls == 2


def test_discounted_credit_by_distance_from_the_end() -> None:
    config = CreditConfig(assignment="discounted", gamma=0.5)
    transitions, _ = build_transitions(rollout(reward=2.0), episode(), config)
    assert [t.reward for t in transitions] == [0.5, 1.0, 2.0]
    assert [t.reward_sources for t in transitions] == [
        {"discounted": 0.5},
        {"discounted": 1.0},
        {"discounted": 2.0},
    ]
    assert all(t.final_reward == 2.0 for t in transitions)


def test_emitted_rewards_go_to_the_call_before_them() -> None:
    spans = [
        reward_span(5.0, t=99.0),  # before any call: nothing to credit
        *episode(),
        reward_span(0.3, t=100.5),  # after call 0
        reward_span(0.2, t=102.5),  # after call 2
        reward_span(0.1, t=102.6),
    ]
    transitions, metrics = build_transitions(
        rollout(reward=1.0), spans, CreditConfig(assignment="equal+emitted")
    )
    assert [t.reward_sources["emitted"] for t in transitions] == pytest.approx([0.3, 0.0, 0.3])
    assert [t.reward for t in transitions] == pytest.approx([1.3, 1.0, 1.3])
    assert metrics.credit_dropped == 1
    assert metrics.source_share()["emitted"] == pytest.approx(0.6 / 3.6)


def test_air_penalises_the_call_that_caused_each_signal() -> None:
    spans = episode()
    spans[1] = llm_span(P2, R2, t=101.0, seq=1, malformed=True)
    spans += [tool_span(t=100.5, error=True), tool_span(t=101.5, error=False)]
    config = CreditConfig(assignment="equal+air", air={"tool_error": 0.25, "malformed_tool_call": 0.5})
    transitions, metrics = build_transitions(rollout(reward=1.0), spans, config)
    assert [t.reward_sources["air"] for t in transitions] == [-0.25, -0.5, 0.0]
    assert [t.reward for t in transitions] == [0.75, 0.5, 1.0]
    assert metrics.air_signals == {"tool_error": 1, "malformed_tool_call": 1}
    # |equal| = 3.0, |air| = 0.75 → shares 0.8 and 0.2
    assert metrics.source_share()["equal"] == pytest.approx(0.8)
    assert metrics.source_share()["air"] == pytest.approx(0.2)
    merged, _ = build_transitions(rollout(reward=1.0), spans, config.model_copy(update={"mode": "merged"}))
    assert merged[0].reward_sources == {"equal": 1.0, "air": -0.75}


def test_timeout_from_the_attempt_or_a_signal_span_hits_the_last_call() -> None:
    config = CreditConfig(assignment="equal+air")
    failed = rollout(reward=None, status=RolloutStatus.failed, error="agent timed out after 30 s")
    transitions, metrics = build_transitions(failed, episode(), config)
    assert [t.reward for t in transitions] == [0.0, 0.0, -0.5]
    assert metrics.air_signals == {"timeout": 1}
    assert metrics.missing_final_reward == 0  # a failed attempt without reward is normal

    expired = [
        Attempt(
            attempt_id="a1",
            rollout_id="r1",
            attempt_no=1,
            runner_id="x",
            lease_deadline=0,
            status=AttemptStatus.timeout,
        )
    ]
    transitions, _ = build_transitions(
        rollout(reward=None, status=RolloutStatus.failed), episode(), config, attempts=expired
    )
    assert transitions[-1].reward_sources["air"] == -0.5

    spans = [*episode(), signal_span(semconv.AIR_TIMEOUT, t=101.5)]
    transitions, _ = build_transitions(rollout(reward=1.0), spans, config)
    assert [t.reward for t in transitions] == [1.0, 0.5, 1.0]


def test_a_timeout_reported_both_as_span_and_as_attempt_error_is_charged_once() -> None:
    # The runner writes a timeout span and fails the attempt with "timed out: ...".
    failed = rollout(reward=None, status=RolloutStatus.failed, error="timed out: the agent did not finish")
    spans = [*episode(), signal_span(semconv.AIR_TIMEOUT, t=103.0)]
    transitions, metrics = build_transitions(failed, spans, CreditConfig(assignment="equal+air"))
    assert [t.reward for t in transitions] == [0.0, 0.0, -0.5]
    assert metrics.air_signals == {"timeout": 1}


def test_the_final_reward_is_the_stored_one_only_and_a_missing_one_is_counted() -> None:
    # A final-reward span is a trace event: the gateway already folded it into rollout.reward.
    spans = [*episode(), reward_span(1.0, t=103.0, final=True)]
    transitions, metrics = build_transitions(rollout(reward=0.25), spans, CreditConfig())
    assert {t.final_reward for t in transitions} == {0.25} and metrics.missing_final_reward == 0
    assert metrics.credit_dropped == 0 and all(t.reward_sources == {"equal": 0.25} for t in transitions)
    transitions, metrics = build_transitions(rollout(reward=None), spans, CreditConfig())
    assert transitions[0].final_reward == 0.0 and metrics.missing_final_reward == 1


def test_unusable_calls_are_skipped_and_counted() -> None:
    spans = episode()
    spans.append(llm_span([1], [5, 6], t=103.0, logprobs=[-0.1]))  # one logprob for two tokens
    spans.append(llm_span([1], [], t=104.0))  # empty completion
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig())
    assert len(transitions) == 3
    assert (metrics.calls, metrics.calls_skipped) == (5, 2)


def test_rollout_status_decides_whether_there_is_anything_to_train() -> None:
    with pytest.raises(InvalidRequestError, match="once it is final"):
        build_transitions(rollout(status=RolloutStatus.running), episode(), CreditConfig())
    transitions, metrics = build_transitions(rollout(status=RolloutStatus.cancelled), episode())
    assert transitions == [] and metrics.rollouts_without_calls == 1
    failed = rollout(reward=0.0, status=RolloutStatus.failed)
    assert build_transitions(failed, episode(), CreditConfig(include_failed=False))[0] == []
    assert len(build_transitions(failed, episode(), CreditConfig())[0]) == 3
    assert build_transitions(rollout(), [], CreditConfig())[0] == []


def test_spans_of_other_rollouts_are_ignored() -> None:
    spans = episode() + episode(rollout_id="other", attempt_id="b1", t0=500.0)
    transitions, _ = build_transitions(rollout(), spans, CreditConfig())
    assert {t.rollout_id for t in transitions} == {"r1"} and len(transitions) == 3
