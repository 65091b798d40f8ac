"""A small calc training run survives SIGKILLs of its runner children, its engine and the trainer.

The driver (`driver.py`) runs `reinforge train` as a user would, kills processes by PID at
seeded-random moments (`CHAOS_SEED`, default 0), starts the same command again after the trainer's
own death, and at the end checks the run folder against the store (`reinforge.training.audit`):
every rollout reached a final status, none finished twice, every transition trained on belongs to a
succeeded attempt, none was trained on twice, no step is logged twice, and every span the store had
acknowledged before a kill is still there. With `CHAOS_REPORT=<file>` the counts are written there
as JSON (docs/reliability.md quotes them).
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from reinforge.store.sql.store import SqlStore
from reinforge.training.audit import RunAudit, audit_run
from reinforge.types import MAX_PAGE_SIZE, SpanQuery

from .driver import ChaosDriver

MAX_STEPS = 40
"""Enough that neither session can end while the driver waits for a restart: on a quiet machine a
step takes well under a second, so a runner child's restart (a new interpreter importing torch) lets
several steps pass, and a run that reached its last step before the driver's next kill would leave
that kill unseen."""
SESSION_TIMEOUT_S = 240.0
"""The longest any one wait may take (a session's start, a step, a restart): well inside the test's
own timeout, so a stuck run fails with the trainer's log instead of pytest's stack dump."""


@pytest.mark.timeout(600)  # about 3 minutes on a busy 2-core machine; the project default is 300 s
def test_training_survives_its_processes_being_killed(tmp_path: Path) -> None:
    seed = int(os.environ.get("CHAOS_SEED", "0"))
    driver = ChaosDriver(tmp_path, seed=seed, max_steps=MAX_STEPS)
    try:
        _first_session(driver)
        _second_session(driver)
        audit, lost = asyncio.run(_final_state(driver))
    finally:
        driver.cleanup()
    report = driver.report
    summary = {
        "seed": seed,
        "kills": report.kills,
        "restarts_seen": report.restarts_seen,
        "sessions": report.sessions,
        "steps": audit.steps,
        "rollouts": audit.rollouts,
        "rollouts_by_status": audit.rollouts_by_status,
        "rollouts_not_final": len(audit.not_final),
        "rollouts_finished_twice": len(audit.finished_twice),
        "transitions_trained": audit.transitions,
        "transitions_trained_twice": len(audit.trained_twice),
        "transitions_of_unsucceeded_attempts": len(audit.not_succeeded),
        "steps_logged_twice": len(audit.steps_logged_twice),
        "acknowledged_spans": len(report.acknowledged_spans),
        "acknowledged_spans_lost": len(lost),
        "events": report.events,
    }
    if os.environ.get("CHAOS_REPORT"):
        Path(os.environ["CHAOS_REPORT"]).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    print("RESULT " + " ".join(f"{k}={v}" for k, v in summary.items() if isinstance(v, int)))

    assert report.exit_codes[-1] == 0, driver.trainer_log()
    assert report.kills["runner"] >= 3 and report.kills["engine"] >= 1 and report.kills["trainer"] == 1
    assert report.restarts_seen == {"runner": report.kills["runner"], "engine": report.kills["engine"]}
    assert audit.steps == MAX_STEPS, summary
    assert audit.not_final == [], summary
    assert audit.finished_twice == [], summary
    assert audit.trained_twice == [], summary
    assert audit.not_succeeded == [], summary
    assert audit.steps_logged_twice == [], summary
    assert audit.transitions > 0 and audit.rollouts >= MAX_STEPS * 16
    assert report.acknowledged_spans and lost == [], summary
    assert audit.ok


def _first_session(driver: ChaosDriver) -> None:
    """Runner child, engine, runner child again, then the trainer itself (past a checkpoint)."""
    driver.start()
    driver.wait_until("the first step", lambda: driver.steps_done() >= 1, SESSION_TIMEOUT_S)
    for kill in (driver.kill_runner, driver.kill_engine, driver.kill_runner):
        step = driver.steps_done()
        driver.pause(0.0, 1.5)
        driver.snapshot_spans()
        kill()
        driver.wait_until("a step after the kill", lambda s=step: driver.steps_done() > s, SESSION_TIMEOUT_S)
    driver.wait_until("step 6 (past a checkpoint)", lambda: driver.steps_done() >= 6, SESSION_TIMEOUT_S)
    driver.pause(0.0, 1.5)
    driver.snapshot_spans()
    driver.kill_trainer()


def _second_session(driver: ChaosDriver) -> None:
    """The same command resumes from the last checkpoint; one more runner kill, then to the end."""
    resumed_at = driver.steps_done()  # read before the new session truncates past its checkpoint
    driver.start()
    driver.wait_until(
        "a step of the resumed run",
        lambda: driver.processes() != {} and 0 < driver.steps_done() != resumed_at,
        SESSION_TIMEOUT_S,
    )
    driver.pause(0.0, 1.0)
    driver.snapshot_spans()
    driver.kill_runner()
    code = driver.wait_trainer(SESSION_TIMEOUT_S)
    assert code == 0, driver.trainer_log()


async def _final_state(driver: ChaosDriver) -> tuple[RunAudit, list[str]]:
    store = await SqlStore.open(f"sqlite:///{driver.run_dir / 'store.db'}")
    try:
        audit = await audit_run(driver.run_dir, store)
        present: set[str] = set()
        offset: int | None = 0
        while offset is not None:
            page = await store.query_spans(SpanQuery(limit=MAX_PAGE_SIZE, offset=offset))
            present.update(s.span_id for s in page.items)
            offset = page.next_offset
    finally:
        await store.close()
    return audit, sorted(driver.report.acknowledged_spans - present)
