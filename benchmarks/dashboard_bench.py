"""The dashboard's rollouts page over a big store: 100k rollouts and 1M spans in SQLite.

What it measures: a store file is built with bulk inserts (the store's own schema, created by
`SqlStore.open`; rows written with one `executemany` per table, since going through the API would
take most of the time budget for nothing the dashboard measures), then served by `reinforge store
serve --run-dir DIR` in its own process, as a user browsing a finished run would. A client in this
process then times, over HTTP with the store token:

- the first screen: `/dashboard/api/overview` then `/dashboard/api/rollouts?limit=50`, in sequence,
  as the page loads them;
- filtered queries: by status, by mode and reward, by task text, by policy version, a combination,
  and pages further back (cursor paging);
- the agent filter, reported on its own (it reads spans; see docs/dashboard.md);
- the baseline: what the page did before (the store's OFFSET query: the total, then the last page
  of 25) and a deep OFFSET page of a status filter, through `/store/rollouts/query`.

    .venv/bin/python benchmarks/dashboard_bench.py [--rollouts 100000] [--spans-per-rollout 10] [--repeat 20]

Ends with `RESULT dashboard_p95_ms=<x>`: the p95 over every first-screen and filtered request
(goal: under 1000).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from reinforge.store.http.auth import read_token
from reinforge.store.sql.store import SqlStore

AGENTS = ["solver", "critic"]
RARE_AGENT = "auditor"
RUNNERS = [f"runner-{i}" for i in range(8)]


def build_store(path: Path, rollouts: int, spans_per_rollout: int, seed: int = 0) -> None:
    """A store file with `rollouts` finished (mostly) rollouts, one attempt each, and their spans."""

    async def create_schema() -> None:
        store = await SqlStore.open(f"sqlite:///{path}")
        await store.close()

    asyncio.run(create_schema())
    rng = random.Random(seed)
    now = time.time() - rollouts * 0.05
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA synchronous=OFF")
    conn.execute("BEGIN")
    versions = max(rollouts // 500, 1)
    conn.executemany(
        "INSERT INTO resources (version, body, created_at) VALUES (?, ?, ?)",
        [(v, json.dumps({"llm": {"model": "m"}, "policy_version": v}), now) for v in range(versions)],
    )
    rollout_rows = []
    attempt_rows = []
    span_rows = []
    sequence = 0
    for i in range(rollouts):
        created = now + i * 0.05
        status = rng.choices(["succeeded", "failed", "running", "queued"], [90, 7, 2, 1])[0]
        mode = "val" if i % 10 == 0 else "train"
        reward = None if status in ("failed", "running", "queued") else float(rng.random() < 0.4)
        rid = f"run-s{i // 64}-{i % 64}"
        aid = f"{i:032x}"
        task = json.dumps(
            {"question": f"task {i % 5000}: what is {rng.randint(0, 99)} + {rng.randint(0, 99)}?"}
        )
        finished = created + 2.0 if status in ("succeeded", "failed") else None
        error = "Traceback: ValueError('bad tool call')" if status == "failed" else None
        rollout_rows.append(
            (i + 1, rid, status, mode, f"t{i % 5000}", f"run-s{i // 64}-{(i % 64) // 8}", i // 500, 2,
             0 if status == "queued" else 1, aid if status == "running" else None, reward, error, created,
             finished or created, finished, task, "{}")
        )  # fmt: skip
        if status == "queued":
            continue
        attempt_status = {"running": "running"}.get(status, status)
        attempt_rows.append(
            (aid, i + 1, rid, 1, RUNNERS[i % len(RUNNERS)], attempt_status, created, created + 60.0,
             created + 1.0, finished, reward, error)
        )  # fmt: skip
        agent = RARE_AGENT if i % 1000 == 7 else AGENTS[i % 2]
        for k in range(spans_per_rollout):
            sequence += 1
            span_id = f"{sequence:016x}"
            name = (
                "reinforge.llm_call" if k % 3 == 0 else ("calculator" if k % 3 == 1 else "reinforge.reward")
            )
            span = {
                "span_id": span_id,
                "trace_id": aid,
                "parent_id": None,
                "rollout_id": rid,
                "attempt_id": aid,
                "name": name,
                "kind": "internal",
                "start_time": created + k * 0.1,
                "end_time": created + k * 0.1 + 0.05,
                "attributes": {"reinforge.agent.name": agent, "reinforge.sequence": k},
                "status": {"code": "unset", "message": None},
                "events": [],
                "sequence": None,
            }
            body = json.dumps(span, separators=(",", ":"))
            span_rows.append((sequence, span_id, aid, rid, aid, name, body))
        if len(span_rows) >= 200_000:
            conn.executemany("INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?)", span_rows)
            span_rows = []
    conn.executemany(f"INSERT INTO rollouts VALUES ({', '.join('?' * 17)})", rollout_rows)
    conn.executemany(f"INSERT INTO attempts VALUES ({', '.join('?' * 12)})", attempt_rows)
    conn.executemany("INSERT INTO spans VALUES (?, ?, ?, ?, ?, ?, ?)", span_rows)
    conn.commit()
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()


def serve(run_dir: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    """`reinforge store serve --run-dir` in its own process; returns it, its URL and the token."""
    url_file = run_dir / "store.url"
    url_file.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-m", "reinforge", "store", "serve", "--run-dir", str(run_dir), "--port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 120
    while not url_file.exists():
        if process.poll() is not None or time.monotonic() > deadline:
            err = process.stderr.read().decode() if process.stderr else ""
            raise RuntimeError(f"reinforge store serve did not start: {err[-2000:]}")
        time.sleep(0.1)
    token = read_token(run_dir)
    assert token is not None
    return process, url_file.read_text().strip(), token


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1000


def p95(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]


def describe(name: str, samples: list[float]) -> None:
    median = statistics.median(samples)
    print(f"  {name:44s} p50 {median:8.1f} ms   p95 {p95(samples):8.1f} ms   n={len(samples)}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rollouts", type=int, default=100_000)
    parser.add_argument("--spans-per-rollout", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--keep", type=Path, help="Build the store here and keep it (reused when present).")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="dashboard-bench-") as tmp:
        run_dir = args.keep or Path(tmp)
        run_dir.mkdir(parents=True, exist_ok=True)
        db = run_dir / "store.db"
        if not db.exists():
            started = time.perf_counter()
            build_store(db, args.rollouts, args.spans_per_rollout)
            print(
                f"built {args.rollouts} rollouts, {args.rollouts * args.spans_per_rollout} spans "
                f"({db.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - started:.1f} s"
            )
        process, url, token = serve(run_dir)
        try:
            run(url, token, args.repeat)
        finally:
            process.terminate()
            process.wait(30)


def run(url: str, token: str, repeat: int) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    client = httpx.Client(base_url=url, headers=headers, timeout=60)

    def get(path: str, **params: Any) -> Any:
        response = client.get("/dashboard/api" + path, params=params)
        response.raise_for_status()
        return response.json()

    def post(path: str, body: dict[str, Any]) -> Any:
        response = client.post("/store" + path, json=body)
        response.raise_for_status()
        return response.json()

    get("/rollouts", limit=1)  # connection, first import of the queries
    versions = get("/overview")["counters"]["latest_resources_version"] or 0
    filters: dict[str, dict[str, Any]] = {
        "status=failed": {"status": "failed"},
        "mode=val & reward >= 1": {"mode": "val", "reward_min": 1},
        "task text (1 in 5000)": {"task": "task 1234:"},
        "policy version": {"policy_version": versions // 2},
        "failed & train & reward <= 0.5": {
            "status": ["failed", "running"],
            "mode": "train",
            "reward_max": 0.5,
        },
    }
    first_screen: list[float] = []
    newest: list[float] = []
    filtered: dict[str, list[float]] = {name: [] for name in filters}
    deeper: list[float] = []
    agent: list[float] = []
    agent_complete = 0
    baseline_recent: list[float] = []
    baseline_deep: list[float] = []
    for _ in range(repeat):
        first_screen.append(timed(lambda: (get("/overview"), get("/rollouts", limit=50))))
        newest.append(timed(lambda: get("/rollouts", limit=50)))
        for name, params in filters.items():
            filtered[name].append(timed(lambda params=params: get("/rollouts", limit=50, **params)))
        cursor = get("/rollouts", limit=50)["next_cursor"]
        for _ in range(5):
            page: dict[str, Any] = {}
            deeper.append(
                timed(lambda c=cursor, page=page: page.update(get("/rollouts", limit=50, before=c)))
            )
            cursor = page["next_cursor"]
        result: dict[str, Any] = {}
        agent.append(timed(lambda result=result: result.update(get("/rollouts", limit=50, agent=RARE_AGENT))))
        agent_complete += bool(result["complete"])

        def old_page() -> None:
            total = post("/rollouts/query", {"limit": 1, "offset": 0})["total"]
            post("/rollouts/query", {"limit": 25, "offset": max(0, total - 25)})

        baseline_recent.append(timed(old_page))
        baseline_deep.append(
            timed(lambda: post("/rollouts/query", {"limit": 50, "offset": 5000, "statuses": ["failed"]}))
        )

    print("dashboard API (reinforge store serve, SQLite):")
    describe("first screen (overview + 50 newest)", first_screen)
    describe("50 newest alone", newest)
    for name, samples in filtered.items():
        describe(f"filter: {name}", samples)
    describe("older pages (cursor, 5 deep)", deeper)
    describe(f"filter: agent (rare; complete {agent_complete}/{repeat})", agent)
    print("baseline: the store's OFFSET query (what the page did before):")
    describe("newest 25 (total, then last page)", baseline_recent)
    describe("status=failed, offset 5000", baseline_deep)
    ours = p95(first_screen + [s for samples in filtered.values() for s in samples] + deeper)
    print(f"RESULT dashboard_first_screen_p95_ms={p95(first_screen):.1f}")
    print(f"RESULT dashboard_agent_filter_p95_ms={p95(agent):.1f}")
    print(f"RESULT dashboard_newest_p95_ms={p95(newest):.1f} baseline={p95(baseline_recent):.1f}")
    print(f"RESULT dashboard_deep_page_p95_ms={p95(deeper):.1f} baseline_offset={p95(baseline_deep):.1f}")
    print(f"RESULT dashboard_p95_ms={ours:.1f}")
    print(f"load {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
