"""Store size: bytes a SQLite store keeps per rollout of the calc demo, and MB per 1,000 demo steps.

A short `reinforge demo` (or the store of one given with `--source`) supplies real rollouts: their
tasks, groups, attempts and spans as the gateway and the agent recorded them. They are replayed
through the store's own API into a fresh SQLite store, `--rounds` times, each round with fresh
rollout, attempt, trace and span ids (so every round is new data of the same shape, as later steps
of a run are). The store's pages in use (`page_count` after a WAL checkpoint) are read after the
first round and after the last:

- **marginal** bytes per rollout: the growth from the first round to the last divided by the
  rollouts added. This is what a long run pays per rollout, free of the fixed cost of a small file
  (every table and index takes at least one 16 KB page);
- **small-store** bytes per rollout: the whole file after one round over its rollouts, the figure
  earlier sessions measured on the demo's own store.

`reinforge demo` runs 128 rollouts a step, so MB per 1,000 demo steps is bytes per rollout x 0.128.
The goal (issue 21) is a fifth of the 1,460 MB per 1,000 steps measured before retention: 292.

    .venv/bin/python benchmarks/store_size_bench.py [--source run/store.db] [--rounds 10]

Ends with `RESULT store_mb_per_1k_demo_steps=...` (marginal) and the small-store figure.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import subprocess
import sys
import tempfile
import uuid
from collections import defaultdict
from pathlib import Path

from reinforge.store.sql.store import SqlStore
from reinforge.types import (
    Attempt,
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    Rollout,
    RolloutQuery,
    RolloutSpec,
    Span,
    SpanQuery,
    new_span_id,
)

DEMO_ROLLOUTS_PER_STEP = 128
GOAL_MB_PER_1K_STEPS = 1460 / 5
PAGE = 500


async def _read_source(path: Path) -> tuple[list[Rollout], dict[str, list[Attempt]], dict[str, list[Span]]]:
    """Every rollout of the source store in enqueue order, its attempts and their spans."""
    store = await SqlStore.open(f"sqlite:///{path}")
    try:
        rollouts: list[Rollout] = []
        offset = 0
        while True:
            page = await store.query_rollouts(RolloutQuery(limit=PAGE, offset=offset))
            rollouts.extend(page.items)
            offset += len(page.items)
            if len(page.items) < PAGE:
                break
        attempts: dict[str, list[Attempt]] = {}
        spans: dict[str, list[Span]] = defaultdict(list)
        for r in rollouts:
            attempts[r.rollout_id] = list(
                (await store.query_attempts(AttemptQuery(rollout_id=r.rollout_id, limit=PAGE))).items
            )
            span_offset = 0
            while True:
                page_s = await store.query_spans(
                    SpanQuery(rollout_id=r.rollout_id, limit=PAGE, offset=span_offset)
                )
                for s in page_s.items:
                    spans[s.attempt_id].append(s)
                span_offset += len(page_s.items)
                if len(page_s.items) < PAGE:
                    break
        return rollouts, attempts, spans
    finally:
        await store.close()


def _renamed(span: Span, attempt_id: str, rollout_id: str, ids: dict[str, str]) -> Span:
    """`span` as the same call of a new attempt: fresh span and trace ids, the new attempt's ids."""

    def fresh(old: str, make: str) -> str:
        if old not in ids:
            ids[old] = new_span_id() if make == "span" else uuid.uuid4().hex
        return ids[old]

    trace = attempt_id if span.trace_id == span.attempt_id else fresh(span.trace_id, "trace")
    return span.model_copy(
        update={
            "span_id": fresh(span.span_id, "span"),
            "trace_id": trace,
            "parent_id": fresh(span.parent_id, "span") if span.parent_id else None,
            "rollout_id": rollout_id,
            "attempt_id": attempt_id,
            "sequence": None,
        }
    )


async def _replay_round(
    store: SqlStore,
    k: int,
    rollouts: list[Rollout],
    attempts: dict[str, list[Attempt]],
    spans: dict[str, list[Span]],
) -> int:
    """Every source rollout once more, with fresh ids, through enqueue, lease, spans and finish."""
    specs = [
        RolloutSpec(
            rollout_id=f"r{k}-{r.rollout_id}",
            task=r.task,
            task_id=r.task_id,
            mode=r.mode,
            group_id=f"r{k}-{r.group_id}" if r.group_id else None,
            resources_version=r.resources_version,
            max_attempts=max(r.max_attempts, len(attempts[r.rollout_id]), 1),
            metadata=r.metadata,
        )
        for r in rollouts
    ]
    # Enqueued a step's batch at a time, as the trainer does.
    for i in range(0, len(specs), DEMO_ROLLOUTS_PER_STEP):
        await store.enqueue_rollouts(specs[i : i + DEMO_ROLLOUTS_PER_STEP])
    source = {f"r{k}-{r.rollout_id}": r for r in rollouts}
    added = 0
    while True:
        leased = await store.lease_rollouts("replay-runner-1", max_rollouts=64)
        if not leased:
            break
        batch: list[Span] = []
        finishes: list[tuple[str, AttemptOutcome]] = []
        for lr in leased:
            old = source[lr.rollout.rollout_id]
            old_attempts = attempts[old.rollout_id]
            old_attempt = old_attempts[lr.attempt.attempt_no - 1] if old_attempts else None
            ids: dict[str, str] = {}
            if old_attempt is not None:
                for s in spans[old_attempt.attempt_id]:
                    batch.append(_renamed(s, lr.attempt.attempt_id, lr.rollout.rollout_id, ids))
            status = old_attempt.status if old_attempt is not None else AttemptStatus.succeeded
            if status not in (AttemptStatus.succeeded, AttemptStatus.failed, AttemptStatus.cancelled):
                status = AttemptStatus.failed
            outcome = AttemptOutcome(
                status=status,
                reward=old_attempt.reward if old_attempt is not None else old.reward,
                error=old_attempt.error if old_attempt is not None else None,
            )
            finishes.append((lr.attempt.attempt_id, outcome))
        for i in range(0, len(batch), 256):
            added += await store.add_spans(batch[i : i + 256])
        for attempt_id, outcome in finishes:
            await store.finish_attempt(attempt_id, outcome)
    return added


def _pages_in_use(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        pages = con.execute("PRAGMA page_count").fetchone()[0]
        page_size = con.execute("PRAGMA page_size").fetchone()[0]
        return int(pages) * int(page_size)
    finally:
        con.close()


def _count_rollouts(path: Path) -> int:
    con = sqlite3.connect(path)
    try:
        return int(con.execute("SELECT count(*) FROM rollouts").fetchone()[0])
    finally:
        con.close()


def _make_source(workdir: Path) -> Path:
    run_dir = workdir / "demo"
    print("running a short demo for the source store (6 steps, about 4 minutes) ...", flush=True)
    cmd = [sys.executable, "-m", "reinforge", "demo", "--run-dir", str(run_dir), "--max-steps", "6"]
    cmd += ["--val-size", "4", "--minutes", "4"]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return run_dir / "store.db"


async def _main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="store-size-") as tmp:
        workdir = Path(tmp)
        source = Path(args.source) if args.source else _make_source(workdir)
        rollouts, attempts, spans = await _read_source(source)
        n_spans = sum(len(v) for v in spans.values())
        print(f"source: {len(rollouts)} rollouts, {n_spans} spans ({source})")
        target = workdir / "replay.db"
        store = await SqlStore.open(f"sqlite:///{target}")
        try:
            await _replay_round(store, 0, rollouts, attempts, spans)
            first_bytes, first_rollouts = _pages_in_use(target), _count_rollouts(target)
            for k in range(1, args.rounds):
                await _replay_round(store, k, rollouts, attempts, spans)
        finally:
            await store.close()
        last_bytes, last_rollouts = _pages_in_use(target), _count_rollouts(target)
    small = first_bytes / first_rollouts
    marginal = (last_bytes - first_bytes) / max(last_rollouts - first_rollouts, 1)
    per_step = DEMO_ROLLOUTS_PER_STEP / 1e6 * 1000
    print(f"after round 1: {first_bytes:,} B for {first_rollouts} rollouts ({small:,.0f} B a rollout)")
    print(f"after round {args.rounds}: {last_bytes:,} B for {last_rollouts} rollouts")
    print(f"marginal: {marginal:,.0f} B a rollout; goal {GOAL_MB_PER_1K_STEPS:.0f} MB per 1,000 demo steps")
    print(
        f"RESULT store_mb_per_1k_demo_steps={marginal * per_step:.1f} "
        f"store_bytes_per_rollout={marginal:.0f} store_small_file_mb_per_1k_demo_steps={small * per_step:.1f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", help="a demo run's store.db to replay (default: run a 6-step demo)")
    parser.add_argument("--rounds", type=int, default=10, help="replays of the source into the fresh store")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (the marginal size is the growth after the first)")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
