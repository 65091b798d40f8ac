"""`transitions.jsonl`: what each step trained on, one line per transition, for the dashboard.

Why the trainer writes it rather than the dashboard recomputing it from spans: a transition's
advantage depends on its whole group, on the algorithm (a PPO critic's values exist only inside the
trainer), on the credit settings and on the policy of that step; recomputing later could disagree with
what was trained. So the record is written once, from the very objects the update used. Token ids are
left out (the spans have them); the response is decoded once here, where the tokenizer is, into runs
of trained and masked tokens. Appended and flushed each step like metrics.jsonl; on resume the lines
past the checkpoint's step are dropped, so the file matches the restored run.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from transformers import PreTrainedTokenizerBase

from reinforge.store.run_files import TRANSITIONS_FILE, TokenSegment, TransitionRecord
from reinforge.types import Transition


def token_segments(transition: Transition, tokenizer: PreTrainedTokenizerBase) -> list[TokenSegment]:
    """The response as runs of equal mask: trained (mask 1) and masked (0: tool results, observations)."""
    segments: list[TokenSegment] = []
    ids, mask = transition.response_ids, transition.response_mask
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or mask[i] != mask[start]:
            run = ids[start:i]
            text = str(tokenizer.decode(run, skip_special_tokens=False))
            segments.append(TokenSegment(text=text, tokens=len(run), trained=bool(mask[start])))
            start = i
    return segments


def transition_record(step: int, t: Transition, tokenizer: PreTrainedTokenizerBase) -> TransitionRecord:
    return TransitionRecord(
        step=step,
        rollout_id=t.rollout_id,
        attempt_id=t.attempt_id,
        index=t.index,
        group_id=t.group_id,
        agent_name=t.agent_name,
        policy_version=t.policy_version,
        num_calls=t.num_calls,
        reward=t.reward,
        final_reward=t.final_reward,
        reward_sources=dict(t.reward_sources),
        advantage=t.advantage,
        prompt_tokens=len(t.prompt_ids),
        response_tokens=len(t.response_ids),
        trained_tokens=int(sum(t.response_mask)),
        segments=token_segments(t, tokenizer),
    )


class TransitionLog:
    """Append-only `<run_dir>/transitions.jsonl`."""

    def __init__(self, run_dir: Path, tokenizer: PreTrainedTokenizerBase) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / TRANSITIONS_FILE
        self._tokenizer = tokenizer

    def write(self, step: int, transitions: Sequence[Transition]) -> None:
        lines = [transition_record(step, t, self._tokenizer).model_dump_json() + "\n" for t in transitions]
        with self.path.open("a", encoding="utf-8") as f:
            f.write("".join(lines))

    def truncate_after(self, step: int) -> None:
        """Drop records of steps after `step` (a resume redoes them)."""
        if not self.path.is_file():
            return
        kept = [
            line
            for line in self.path.read_text(encoding="utf-8").splitlines(keepends=True)
            if line.strip() and _step_of(line) <= step
        ]
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        tmp.replace(self.path)


def _step_of(line: str) -> int:
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError):
        return 1 << 62  # a torn line from a killed writer: dropped with the steps past the checkpoint
