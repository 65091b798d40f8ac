"""Audit a run folder against its store: was anything lost, finished twice or trained on twice?

After crashes and resumes a user (or a chaos test) wants to know that the training the weights came
from is sound. The trainer already records everything needed: `metrics.jsonl` (one record per step),
`transitions.jsonl` (every transition each step trained on: rollout, attempt, index) and the store
(every rollout and attempt). Both files are cut back to the checkpoint on resume, so they describe the
training the current weights come from. The checks:

- every rollout in the store is final (none left queued or running), and none has more than one
  succeeded attempt (a rollout finished twice);
- every transition trained on belongs to an attempt that succeeded (unless the run trains on failed
  rollouts on purpose, `credit.include_failed`: pass `allow_failed=True`);
- no transition (attempt, index) was trained on twice, and no step is logged twice.

    python -m reinforge.training.audit runs/calc            # exit status 1 when a check fails
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

from pydantic import BaseModel, Field

from reinforge.errors import InvalidRequestError
from reinforge.store.protocol import Store
from reinforge.store.run_files import METRICS_FILE, TRANSITIONS_FILE
from reinforge.types import MAX_PAGE_SIZE, AttemptQuery, AttemptStatus, RolloutQuery

_STEP_KEY = "train/reward"
"""Every training step's metrics record has it; validation and final records do not."""


class RunAudit(BaseModel):
    """What `audit_run` found. `ok` when every problem list is empty."""

    steps: int = 0
    """Training steps in metrics.jsonl."""
    rollouts: int = 0
    """Rollouts in the store (every session's, validation included)."""
    rollouts_by_status: dict[str, int] = Field(default_factory=dict)
    transitions: int = 0
    """Transitions trained on (transitions.jsonl)."""
    attempts_trained: int = 0
    not_final: list[str] = Field(default_factory=list)
    """Rollouts still queued or running."""
    finished_twice: list[str] = Field(default_factory=list)
    """Rollouts with more than one succeeded attempt."""
    trained_twice: list[str] = Field(default_factory=list)
    """`attempt_id#index` of transitions trained on more than once."""
    not_succeeded: list[str] = Field(default_factory=list)
    """`attempt_id (status)` of attempts trained on that did not succeed."""
    steps_logged_twice: list[int] = Field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (
            self.not_final
            or self.finished_twice
            or self.trained_twice
            or self.not_succeeded
            or self.steps_logged_twice
        )


def _jsonl(path: Path) -> list[dict[str, object]]:
    """The file's complete JSON lines (a line torn by a kill mid-write is skipped)."""
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


async def audit_run(run_dir: Path, store: Store, *, allow_failed: bool = False) -> RunAudit:
    """Check `run_dir`'s metrics and transitions against `store` (see the module docstring)."""
    if not (run_dir / METRICS_FILE).is_file():
        raise InvalidRequestError(f"{run_dir} has no {METRICS_FILE}: not a run folder, or no step ran yet")
    audit = RunAudit()
    step_counts = Counter(int(str(r["step"])) for r in _jsonl(run_dir / METRICS_FILE) if _STEP_KEY in r)
    audit.steps = len(step_counts)
    audit.steps_logged_twice = sorted(step for step, n in step_counts.items() if n > 1)

    seen: Counter[tuple[str, int]] = Counter()
    for record in _jsonl(run_dir / TRANSITIONS_FILE):
        seen[(str(record["attempt_id"]), int(str(record["index"])))] += 1
    audit.transitions = sum(seen.values())
    audit.trained_twice = sorted(f"{a}#{i}" for (a, i), n in seen.items() if n > 1)
    trained_attempts = {attempt_id for attempt_id, _ in seen}
    audit.attempts_trained = len(trained_attempts)

    succeeded: Counter[str] = Counter()
    status_of: dict[str, AttemptStatus] = {}
    offset: int | None = 0
    while offset is not None:
        page = await store.query_attempts(AttemptQuery(limit=MAX_PAGE_SIZE, offset=offset))
        for attempt in page.items:
            status_of[attempt.attempt_id] = attempt.status
            if attempt.status == AttemptStatus.succeeded:
                succeeded[attempt.rollout_id] += 1
        offset = page.next_offset
    fine = {AttemptStatus.succeeded, AttemptStatus.failed} if allow_failed else {AttemptStatus.succeeded}
    for attempt_id in sorted(trained_attempts):
        status = status_of.get(attempt_id)
        if status not in fine:
            audit.not_succeeded.append(f"{attempt_id} ({status.value if status else 'not in the store'})")

    by_status: Counter[str] = Counter()
    offset = 0
    while offset is not None:
        rollouts = await store.query_rollouts(RolloutQuery(limit=MAX_PAGE_SIZE, offset=offset))
        for rollout in rollouts.items:
            by_status[rollout.status.value] += 1
            if not rollout.status.is_final:
                audit.not_final.append(rollout.rollout_id)
            if succeeded[rollout.rollout_id] > 1:
                audit.finished_twice.append(rollout.rollout_id)
        offset = rollouts.next_offset
    audit.rollouts = sum(by_status.values())
    audit.rollouts_by_status = dict(by_status)
    return audit


async def _main(run_dir: Path) -> int:
    from reinforge.store.factory import open_store

    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        audit = await audit_run(run_dir, store)
    finally:
        await store.close()
    print(json.dumps({"ok": audit.ok, **audit.model_dump()}, indent=2))
    return 0 if audit.ok else 1


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print("usage: python -m reinforge.training.audit RUN_DIR", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(asyncio.run(_main(Path(sys.argv[1]))))
