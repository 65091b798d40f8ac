"""Spans → transitions with credit: the entry point of credit/."""

from __future__ import annotations

from collections.abc import Sequence

from reinforge import semconv
from reinforge.credit.calls import LLMCall, attempt_timed_out, read_attempt, select_attempt
from reinforge.credit.config import CreditConfig
from reinforge.credit.merge import Sample, merge_calls, per_call
from reinforge.credit.metrics import CreditMetrics
from reinforge.errors import InvalidRequestError
from reinforge.types import Attempt, Rollout, RolloutStatus, Span, Transition


def build_transitions(
    rollout: Rollout,
    spans: Sequence[Span],
    config: CreditConfig | None = None,
    *,
    attempts: Sequence[Attempt] = (),
) -> tuple[list[Transition], CreditMetrics]:
    """Turn one finished rollout's spans into transitions with credit assigned.

    Only spans of the rollout's final attempt are used: the last succeeded attempt in `attempts`
    (the store's attempt records for this rollout), else the last attempt. The final reward is
    `rollout.reward`, the one stored value (the gateway decided it when the attempt finished:
    `reinforge.gateway.finishing`), else 0.0 (counted as missing); reward spans are not read for it.
    """
    config = config or CreditConfig()
    metrics = CreditMetrics(rollouts=1)
    if not rollout.status.is_final:
        raise InvalidRequestError(
            f"rollout {rollout.rollout_id} is {rollout.status.value}; build transitions once it is final"
        )
    if rollout.status == RolloutStatus.cancelled or (
        rollout.status == RolloutStatus.failed and not config.include_failed
    ):
        metrics.rollouts_without_calls = 1
        return [], metrics
    attempt_id = select_attempt(rollout, spans, attempts)
    if attempt_id is None:
        metrics.rollouts_without_calls = 1
        return [], metrics

    found = read_attempt(spans, attempt_id)
    calls = found.calls
    already_signalled = any(semconv.AIR_TIMEOUT in c.air for c in calls)
    if calls and not already_signalled and attempt_timed_out(rollout, attempts, attempt_id):
        # The call running when time ran out caused it. A runner that failed the attempt for a
        # timeout also writes a timeout span; one timeout is charged once.
        calls[-1].air[semconv.AIR_TIMEOUT] = calls[-1].air.get(semconv.AIR_TIMEOUT, 0) + 1
    final_reward = rollout.reward
    if final_reward is None:
        # A failed attempt often has no reward; a succeeded one without any is worth flagging.
        metrics.missing_final_reward = int(rollout.status == RolloutStatus.succeeded)
        final_reward = 0.0

    metrics.calls = len(calls) + found.skipped
    metrics.calls_skipped = found.skipped
    metrics.credit_dropped = found.dropped_events
    metrics.calls_named_by_role = found.named_by_role
    metrics.calls_role_ambiguous = found.role_ambiguous
    for call in calls:
        for signal, count in call.air.items():
            metrics.air_signals[signal] = metrics.air_signals.get(signal, 0) + count
        metrics.history_respelled += _count(call, semconv.ATTR_HISTORY_RESPELLED)
        metrics.history_unmatched += _count(call, semconv.ATTR_HISTORY_UNMATCHED)
    trained = [c for c in calls if config.agents is None or c.agent_name in config.agents]
    metrics.calls_trained = len(trained)
    metrics.calls_filtered = len(calls) - len(trained)
    kept = {id(c) for c in trained}
    metrics.credit_dropped += sum(1 for c in calls if id(c) not in kept and (c.emitted or c.air))
    if not trained:
        metrics.rollouts_without_calls = 1
        return [], metrics

    if config.mode == "merged":
        merge = merge_calls(trained)
        samples, metrics.merged_calls = merge.samples, merge.merged
        metrics.merge_mismatches = sum(merge.mismatches.values())
        metrics.merge_mismatch_reasons = merge.mismatches
    else:
        samples = per_call(trained)

    transitions = []
    for index, sample in enumerate(samples):
        sources = _credit(sample, index, len(samples), final_reward, config)
        for source, value in sources.items():
            metrics.source_abs[source] = metrics.source_abs.get(source, 0.0) + abs(value)
        transitions.append(_transition(rollout, attempt_id, sample, index, final_reward, sources))
        metrics.trained_tokens += sum(sample.response_mask)
        metrics.masked_tokens += len(sample.response_mask) - sum(sample.response_mask)
        metrics.prompt_tokens += len(sample.prompt_ids)
    metrics.transitions = len(transitions)
    metrics.merged_transitions = sum(1 for t in transitions if t.num_calls > 1)
    return transitions, metrics


def _credit(
    sample: Sample, index: int, count: int, final_reward: float, config: CreditConfig
) -> dict[str, float]:
    """The credit each source gives this sample; a merged sample sums what its calls earned."""
    sources: dict[str, float] = {}
    if "equal" in config.assignment:
        sources["equal"] = final_reward
    if "discounted" in config.assignment:
        sources["discounted"] = config.gamma ** (count - 1 - index) * final_reward
    if "emitted" in config.assignment:
        sources["emitted"] = sum(call.emitted for call in sample.calls)
    if "air" in config.assignment:
        sources["air"] = 0.0 - sum(_penalty(call, config) for call in sample.calls)  # never -0.0
    return sources


def _count(call: LLMCall, key: str) -> int:
    value = call.span.attributes.get(key, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _penalty(call: LLMCall, config: CreditConfig) -> float:
    penalties = {
        semconv.AIR_TOOL_ERROR: config.air.tool_error,
        semconv.AIR_MALFORMED_TOOL_CALL: config.air.malformed_tool_call,
        semconv.AIR_TIMEOUT: config.air.timeout,
    }
    return sum(penalties[signal] * count for signal, count in call.air.items())


def _transition(
    rollout: Rollout,
    attempt_id: str,
    sample: Sample,
    index: int,
    final_reward: float,
    sources: dict[str, float],
) -> Transition:
    return Transition(
        rollout_id=rollout.rollout_id,
        attempt_id=attempt_id,
        group_id=rollout.group_id,
        task_id=rollout.task_id,
        agent_name=sample.calls[0].agent_name,
        index=index,
        prompt_ids=sample.prompt_ids,
        response_ids=sample.response_ids,
        response_mask=sample.response_mask,
        behaviour_logprobs=sample.logprobs,
        # The oldest version in the sample: how stale its behaviour logprobs can be.
        policy_version=min(call.policy_version for call in sample.calls),
        reward=sum(sources.values()),
        final_reward=final_reward,
        reward_sources=sources,
        num_calls=len(sample.calls),
    )
