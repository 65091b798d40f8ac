"""Why calls do not merge: each way an agent can break its history gets its own reason, counted per
rollout as `credit/merge_mismatch/<reason>`, beside `credit/merged_transitions`."""

from __future__ import annotations

from reinforge.credit import CreditConfig, CreditMetrics, build_transitions
from reinforge.credit.merge import MISMATCH_REASONS

from .span_factory import llm_span, rollout

SYSTEM = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
ASSISTANT_HEADER = [13, 14, 15]
START = SYSTEM + ASSISTANT_HEADER
REPLY = [20, 21, 22, 23, 24, 25]
OBSERVATION = [30, 31]


def _two_calls(second_prompt: list[int]) -> CreditMetrics:
    spans = [
        llm_span(START, REPLY, t=1.0, seq=0),
        llm_span(second_prompt, [40, 41], t=2.0, seq=1),
    ]
    _, metrics = build_transitions(rollout(), spans, CreditConfig(mode="merged"))
    return metrics


def test_an_appended_history_merges_and_counts_a_merged_transition() -> None:
    metrics = _two_calls(START + REPLY + OBSERVATION)
    assert (metrics.merged_calls, metrics.merge_mismatches, metrics.merged_transitions) == (1, 0, 1)
    assert metrics.merge_mismatch_reasons == {}
    assert not any(key.startswith("credit/merge_mismatch/") for key in metrics.as_dict())


def test_a_reply_left_out_of_the_history_is_reply_dropped() -> None:
    # mini-swe-agent after a reply it cannot parse: system, task, then its "format error" message
    # where the reply's turn (assistant header, reply) was.
    metrics = _two_calls([*SYSTEM, 50, 51, 52])
    assert metrics.merge_mismatch_reasons == {"reply_dropped": 1}
    assert metrics.as_dict()["credit/merge_mismatch/reply_dropped"] == 1.0
    assert (metrics.merged_transitions, metrics.transitions) == (0, 2)


def test_a_reply_sent_back_retokenised_is_reply_changed() -> None:
    respelled = [99, *REPLY[1:-1], 98]  # same text inside, different tokens at its edges
    metrics = _two_calls(START + respelled + OBSERVATION)
    assert metrics.merge_mismatch_reasons == {"reply_changed": 1}


def test_an_edited_earlier_turn_is_history_edited() -> None:
    metrics = _two_calls([1, 2, 77, 4, *REPLY, *OBSERVATION])
    assert metrics.merge_mismatch_reasons == {"history_edited": 1}


def test_a_shorter_history_is_history_truncated() -> None:
    metrics = _two_calls(START + REPLY[:3])
    assert metrics.merge_mismatch_reasons == {"history_truncated": 1}


def test_reasons_add_up_across_rollouts_and_match_the_mismatch_count() -> None:
    total = _two_calls([*SYSTEM, 50]) + _two_calls([*SYSTEM, 50]) + _two_calls([9, *REPLY])
    assert total.merge_mismatch_reasons == {"reply_dropped": 2, "history_edited": 1}
    assert total.merge_mismatches == sum(total.merge_mismatch_reasons.values())
    assert set(total.merge_mismatch_reasons) <= set(MISMATCH_REASONS)
    flat = total.as_dict()
    assert (flat["credit/merge_mismatch/reply_dropped"], flat["credit/merge_mismatch/history_edited"]) == (
        2,
        1,
    )
    assert flat["credit/merge_rate"] == 0.0 and flat["credit/merged_transitions"] == 0.0


def test_a_merged_sample_judges_against_its_last_reply() -> None:
    # Three calls: the second extends the first; the third drops the second's reply.
    second_prompt = START + REPLY + OBSERVATION + ASSISTANT_HEADER
    second_reply = [60, 61, 62, 63]
    spans = [
        llm_span(START, REPLY, t=1.0, seq=0),
        llm_span(second_prompt, second_reply, t=2.0, seq=1),
        llm_span([*START, *REPLY, *OBSERVATION, 70, 71], [80], t=3.0, seq=2),
    ]
    transitions, metrics = build_transitions(rollout(), spans, CreditConfig(mode="merged"))
    assert [t.num_calls for t in transitions] == [2, 1]
    assert metrics.merge_mismatch_reasons == {"reply_dropped": 1}
    assert metrics.merged_transitions == 1
