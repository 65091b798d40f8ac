"""Merging an attempt's LLM calls along exact token prefixes.

A chat agent's next prompt usually is the previous prompt, the previous response, then the tool
result or observation. When the token ids say exactly that, the calls become one sample whose
in-between tokens are context only (mask 0). Re-tokenised or edited histories don't extend exactly;
those calls start a new sample, and the mismatch is counted rather than guessed around.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from reinforge.credit.calls import LLMCall

log = logging.getLogger(__name__)


@dataclass
class Sample:
    """One future transition: a prompt, then response tokens with a train mask, from 1+ calls."""

    calls: list[LLMCall]
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)

    @classmethod
    def of(cls, call: LLMCall) -> Sample:
        return cls(
            calls=[call],
            prompt_ids=list(call.prompt_ids),
            response_ids=list(call.response_ids),
            response_mask=[1] * len(call.response_ids),
            logprobs=list(call.logprobs),
        )

    def extend_with(self, call: LLMCall) -> bool:
        """Append `call` if its prompt starts with this sample's full sequence; False otherwise."""
        history = len(self.prompt_ids) + len(self.response_ids)
        if len(call.prompt_ids) < history:
            return False
        if call.prompt_ids[: len(self.prompt_ids)] != self.prompt_ids:
            return False
        if call.prompt_ids[len(self.prompt_ids) : history] != self.response_ids:
            return False
        gap = call.prompt_ids[history:]
        self.response_ids += gap + call.response_ids
        self.response_mask += [0] * len(gap) + [1] * len(call.response_ids)
        self.logprobs += [0.0] * len(gap) + call.logprobs
        self.calls.append(call)
        return True


def per_call(calls: list[LLMCall]) -> list[Sample]:
    return [Sample.of(call) for call in calls]


def merge_calls(calls: list[LLMCall]) -> tuple[list[Sample], int, int]:
    """Samples, how many calls were merged onto a previous one, and how many failed to extend."""
    samples: list[Sample] = []
    merged = mismatches = 0
    for call in calls:
        if samples and samples[-1].calls[-1].agent_name != call.agent_name:
            # Another agent's call is its own sample even if it shares the history.
            samples.append(Sample.of(call))
            continue
        if samples and samples[-1].extend_with(call):
            merged += 1
            continue
        if samples:
            mismatches += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("merge mismatch: %s", describe_mismatch(samples[-1], call))
        samples.append(Sample.of(call))
    return samples, merged, mismatches


def describe_mismatch(sample: Sample, call: LLMCall, context: int = 8) -> str:
    """Where `call`'s prompt stops following `sample`'s tokens: what a merge-mismatch log says."""
    history = sample.prompt_ids + sample.response_ids
    at = next((i for i, (a, b) in enumerate(zip(history, call.prompt_ids, strict=False)) if a != b), None)
    if at is None:
        at = min(len(history), len(call.prompt_ids))
    where = "prompt" if at < len(sample.prompt_ids) else "response/gap"
    return (
        f"span {call.span.span_id} ({call.agent_name}) after span {sample.calls[-1].span.span_id} "
        f"({sample.calls[-1].agent_name}): diverges at token {at} ({where}) of a {len(history)}-token "
        f"history; history {history[max(0, at - context) : at + context]} "
        f"prompt {call.prompt_ids[max(0, at - context) : at + context]}"
    )
