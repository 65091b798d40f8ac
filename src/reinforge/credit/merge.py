"""Merging an attempt's LLM calls along exact token prefixes.

A chat agent's next prompt usually is the previous prompt, the previous response, then the tool
result or observation. When the token ids say exactly that, the calls become one sample whose
in-between tokens are context only (mask 0). Re-tokenised or edited histories don't extend exactly;
those calls start a new sample, and the mismatch is counted rather than guessed around, by reason
(`mismatch_reason`), so a user whose calls do not merge learns what the agent did to its history.
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


@dataclass
class MergeOutcome:
    """The samples, how many calls joined the one before, and why the others did not (reason → count)."""

    samples: list[Sample]
    merged: int
    mismatches: dict[str, int]


def merge_calls(calls: list[LLMCall]) -> MergeOutcome:
    """Merge each call onto the previous call's sample where its prompt extends it exactly."""
    samples: list[Sample] = []
    merged = 0
    mismatches: dict[str, int] = {}
    for call in calls:
        if samples and samples[-1].calls[-1].agent_name != call.agent_name:
            # Another agent's call is its own sample even if it shares the history.
            samples.append(Sample.of(call))
            continue
        if samples and samples[-1].extend_with(call):
            merged += 1
            continue
        if samples:
            reason = mismatch_reason(samples[-1], call)
            mismatches[reason] = mismatches.get(reason, 0) + 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug("merge mismatch (%s): %s", reason, describe_mismatch(samples[-1], call))
        samples.append(Sample.of(call))
    return MergeOutcome(samples=samples, merged=merged, mismatches=mismatches)


MISMATCH_REASONS = ("history_edited", "reply_dropped", "reply_changed", "history_truncated")
"""Why a call's prompt did not extend the sample before it (`mismatch_reason`)."""

_REPLY_PROBE = 16
"""Tokens from inside the previous reply looked for in the next prompt: enough not to be found by chance."""


_GENERATION_PROMPT = 8
"""Tokens before a reply counted as its turn's opening (a chat template's assistant header)."""


def mismatch_reason(sample: Sample, call: LLMCall) -> str:
    """Why `call` did not extend `sample`, judged from where its prompt leaves the sample's tokens.

    - `history_edited`: it diverges before the previous reply's turn: the system prompt, the task or an
      earlier turn changed (compaction, a summary, a trimmed window, an edited observation).
    - `reply_dropped`: it diverges at the previous reply's turn and the reply is not in the prompt at
      all: the agent left it out (mini-swe-agent keeps only its "format error" message after a reply
      it cannot parse) or replaced it.
    - `reply_changed`: it diverges at the previous reply's turn but the reply's inner tokens are there:
      the agent sent it back re-spelled or edited, so its tokens differ (re-tokenisation).
    - `history_truncated`: the prompt is a strict prefix of the sample: the history got shorter.
    """
    history = sample.prompt_ids + sample.response_ids
    prompt = call.prompt_ids
    at = next((i for i, (a, b) in enumerate(zip(history, prompt, strict=False)) if a != b), None)
    if at is None:
        return "history_truncated"
    reply = sample.calls[-1].response_ids
    reply_start = len(history) - len(reply)
    # The last prompt ends with the template's generation prompt (`<|im_start|>assistant\n`): a
    # history without the reply leaves it there, so it is part of the reply's turn.
    if at < reply_start - _GENERATION_PROMPT:
        return "history_edited"
    inner = reply[1:-1] if len(reply) > 2 else reply
    probe = inner[:_REPLY_PROBE]
    return "reply_changed" if probe and _contains(prompt[at:], probe) else "reply_dropped"


def _contains(haystack: list[int], needle: list[int]) -> bool:
    first, size = needle[0], len(needle)
    return any(haystack[i : i + size] == needle for i, t in enumerate(haystack) if t == first)


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
