"""Store throughput over HTTP: reinforge (SQLite behind `reinforge store serve`) vs agentlightning 1.0.2.

What it measures, for each system in the same run and on the same machine:
- completed rollouts/s: enqueue N rollouts (5,000; `--quick`: 300), then 16 concurrent clients each
  lease a rollout, record its 6 LLM-call spans (~7.7 KB each, vLLM token ids and logprobs) and one
  reward, and finish it, until the queue is empty. Wall time from the first enqueue to the last finish.
- lease latency p50/p99 as each client sees it (agentlightning: list queued + claim by PATCH).
- span ingest spans/s over HTTP: 16 clients posting LLM-call spans (reinforge: batches of 100;
  agentlightning has no batch call, so one event per request).

Each server runs in its own process (reinforge: `reinforge store serve --db sqlite:///...`, the
durable default; agentlightning: its FastAPI app, whose store is in memory), the clients in another.
agentlightning is installed into `.bench/agl-venv` (Python 3.12) on first use; if that fails the
script says why and prints no ratio.

    .venv/bin/python benchmarks/store_bench.py [--quick] [--rollouts N] [--clients 16] [--skip-baseline]

Ends with `RESULT store_rollouts_per_s_ratio=<ours/theirs>` (goal >= 10).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _agl import AglServer, BaselineUnavailable, agl_python, run_driver, wait_http
from baselines.payload import SPAN_BYTES, llm_call, padded
from baselines.procstat import cpu_seconds

from reinforge import semconv
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import AttemptOutcome, AttemptStatus, RolloutSpec, Span, SpanKind

LLM_CALLS_PER_ROLLOUT = 6
ENQUEUE_BATCH = 500
INGEST_BATCH = 100


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def llm_attributes(pad_words: int) -> dict[str, Any]:
    """The attributes the gateway records for one LLM call (see reinforge.semconv)."""
    call = llm_call(pad_words=pad_words)
    return {
        semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
        semconv.ATTR_LLM_ENDPOINT: "chat.completions",
        semconv.ATTR_LLM_REQUEST: call["request"],
        semconv.ATTR_LLM_RESPONSE: call["response"],
        semconv.ATTR_PROMPT_TOKEN_IDS: call["prompt_token_ids"],
        semconv.ATTR_COMPLETION_TOKEN_IDS: call["completion_token_ids"],
        semconv.ATTR_COMPLETION_LOGPROBS: call["logprobs"],
        semconv.ATTR_POLICY_VERSION: 0,
        semconv.ATTR_FINISH_REASON: "stop",
        semconv.ATTR_MODEL: "policy",
        semconv.ATTR_LATENCY_MS: 12.5,
    }


def llm_span(rollout_id: str, attempt_id: str, attributes: dict[str, Any], seq: int) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_LLM_CALL,
        kind=SpanKind.client,
        attributes={**attributes, semconv.ATTR_SEQUENCE_IN_ATTEMPT: seq},
    )


def reward_span(rollout_id: str, attempt_id: str) -> Span:
    return Span(
        rollout_id=rollout_id,
        attempt_id=attempt_id,
        name=semconv.SPAN_FINAL_REWARD,
        attributes={semconv.ATTR_STEP_KIND: semconv.STEP_REWARD, semconv.ATTR_REWARD_VALUE: 1.0},
    )


class StoreServer:
    """`reinforge store serve` on SQLite in a temporary run folder, in its own process."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        db = f"sqlite:///{run_dir / 'store.db'}"
        self._proc = subprocess.Popen(
            # Exactly `reinforge store serve`, with this interpreter.
            [
                sys.executable,
                "-m",
                "reinforge.cli",
                "store",
                "serve",
                "--run-dir",
                str(run_dir),
                "--db",
                db,
                "--port",
                "0",
            ],
            stdout=subprocess.DEVNULL,
        )
        url_file = run_dir / "store.url"
        deadline = time.monotonic() + 60
        while not url_file.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("`reinforge store serve` did not start; see its log above")
            time.sleep(0.05)
        self.url = url_file.read_text().strip()
        self.token = (run_dir / "store.token").read_text().strip()
        wait_http(self.url + "/health")

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(15)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


async def _worker(
    client: HttpStoreClient,
    worker: int,
    attributes: dict[str, Any],
    lease_ms: list[float],
    attempts: list[tuple[str, str]],
) -> int:
    done = 0
    runner_id = f"bench-{worker}"
    while True:
        started = time.perf_counter()
        leased = await client.lease_rollouts(runner_id, max_rollouts=1, lease_seconds=300.0)
        if not leased:
            return done
        lease_ms.append((time.perf_counter() - started) * 1000)
        rollout_id, attempt_id = leased[0].rollout.rollout_id, leased[0].attempt.attempt_id
        spans = [llm_span(rollout_id, attempt_id, attributes, k) for k in range(LLM_CALLS_PER_ROLLOUT)]
        spans.append(reward_span(rollout_id, attempt_id))
        await client.add_spans(spans)
        await client.finish_attempt(attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0))
        attempts.append((rollout_id, attempt_id))
        done += 1


async def _ingest(
    clients: list[HttpStoreClient], attempts: list[tuple[str, str]], total: int, attributes: dict[str, Any]
) -> tuple[int, float]:
    per_client = total // len(clients)

    async def one(c: int, client: HttpStoreClient) -> None:
        for start in range(0, per_client, INGEST_BATCH):
            batch = []
            for k in range(start, min(per_client, start + INGEST_BATCH)):
                rollout_id, attempt_id = attempts[(c * per_client + k) % len(attempts)]
                batch.append(llm_span(rollout_id, attempt_id, attributes, 100 + k))
            await client.add_spans(batch)

    started = time.perf_counter()
    await asyncio.gather(*(one(c, client) for c, client in enumerate(clients)))
    return per_client * len(clients), time.perf_counter() - started


async def run_reinforge(n: int, n_clients: int, ingest_spans: int) -> dict[str, Any]:
    pad, span_bytes = padded(
        lambda p: len(llm_span("r" * 32, "a" * 32, llm_attributes(p), 0).model_dump_json()), SPAN_BYTES
    )
    attributes = llm_attributes(pad)
    with tempfile.TemporaryDirectory(prefix="reinforge-store-bench-") as tmp:
        server = StoreServer(Path(tmp))
        clients = [HttpStoreClient(server.url, server.token, max_connections=4) for _ in range(n_clients)]
        try:
            lease_ms: list[float] = []
            attempts: list[tuple[str, str]] = []
            cpu_start = cpu_seconds(server.pid) or 0.0
            started = time.perf_counter()
            for i in range(0, n, ENQUEUE_BATCH):
                specs = [
                    RolloutSpec(task={"data_id": str(k), "question": f"what is {k} + {k}?"})
                    for k in range(i, min(n, i + ENQUEUE_BATCH))
                ]
                await clients[0].enqueue_rollouts(specs)
            enqueued = time.perf_counter()
            counts = await asyncio.gather(
                *(_worker(client, w, attributes, lease_ms, attempts) for w, client in enumerate(clients))
            )
            finished = time.perf_counter()
            cpu_finished = cpu_seconds(server.pid) or 0.0
            client_cpu_finished = time.process_time()
            ingested, ingest_seconds = (
                await _ingest(clients, attempts, ingest_spans, attributes) if ingest_spans else (0, 0.0)
            )
            cpu_ingested = cpu_seconds(server.pid) or 0.0
            client_cpu_ingested = time.process_time()
        finally:
            for client in clients:
                await client.close()
            server.stop()
    completed = sum(counts)
    return {
        "system": "reinforge (HTTP, SQLite)",
        "rollouts": n,
        "completed": completed,
        "clients": n_clients,
        "span_bytes": span_bytes,
        "enqueue_seconds": enqueued - started,
        "seconds": finished - started,
        "rollouts_per_s": completed / (finished - started),
        "lease_p50_ms": statistics.median(lease_ms) if lease_ms else None,
        "lease_p99_ms": percentile(lease_ms, 0.99) if lease_ms else None,
        "ingest_spans": ingested,
        "ingest_seconds": ingest_seconds,
        "ingest_spans_per_s": ingested / ingest_seconds if ingest_seconds else None,
        "server_cpu_ms_per_rollout": 1000 * (cpu_finished - cpu_start) / max(1, completed),
        "server_cpu_us_per_span": 1e6 * (cpu_ingested - cpu_finished) / ingested if ingested else None,
        "client_cpu_us_per_span": (
            1e6 * (client_cpu_ingested - client_cpu_finished) / ingested if ingested else None
        ),
    }


def run_agl(n: int, n_clients: int, ingest_spans: int) -> dict[str, Any]:
    python = agl_python()
    with AglServer(python) as server:
        return run_driver(
            python,
            "agl_store_driver.py",
            "--url",
            server.url,
            "--rollouts",
            str(n),
            "--clients",
            str(n_clients),
            "--ingest-spans",
            str(ingest_spans),
            "--server-pid",
            str(server.pid),
        )


def _fmt(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def report(rows: list[dict[str, Any]]) -> None:
    header = (
        f"{'system':<26}{'rollouts':>9}{'done':>6}{'span B':>7}{'total s':>9}{'rollouts/s':>11}"
        f"{'lease p50':>10}{'lease p99':>10}{'ingest spans/s':>15}{'srv CPU ms/rollout':>19}"
        f"{'srv CPU us/span':>16}"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r['system']:<26}{r['rollouts']:>9}{r['completed']:>6}{r['span_bytes']:>7}"
            f"{_fmt(r['seconds'], 2):>9}{_fmt(r['rollouts_per_s']):>11}"
            f"{_fmt(r['lease_p50_ms'], 2):>10}{_fmt(r['lease_p99_ms'], 2):>10}"
            f"{_fmt(r['ingest_spans_per_s'], 0):>15}{_fmt(r['server_cpu_ms_per_rollout'], 2):>19}"
            f"{_fmt(r['server_cpu_us_per_span'], 0):>16}"
        )
    print(
        "(lease in ms as each client sees it; srv CPU: the server process's CPU time per completed "
        "rollout, and per span in the ingest phase)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="a smaller workload (under a minute)")
    parser.add_argument("--rollouts", type=int, help="rollouts to enqueue (default 5000; quick 300)")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument(
        "--ingest-spans", type=int, help="spans in the ingest phase (default 20000; quick 3000)"
    )
    parser.add_argument(
        "--baseline-rollouts", type=int, help="rollouts for agentlightning (default: the same as ours)"
    )
    parser.add_argument("--skip-baseline", action="store_true", help="measure reinforge only (no ratio)")
    args = parser.parse_args()
    n = args.rollouts or (300 if args.quick else 5000)
    ingest = args.ingest_spans if args.ingest_spans is not None else (3000 if args.quick else 20000)
    n_agl = args.baseline_rollouts or n

    print(
        f"store_bench: {n} rollouts x ({LLM_CALLS_PER_ROLLOUT} LLM-call spans of ~{SPAN_BYTES} B "
        f"+ 1 reward), {args.clients} concurrent HTTP clients; ingest phase {ingest} spans; "
        f"cpus={os.cpu_count()}",
        flush=True,
    )
    ours = asyncio.run(run_reinforge(n, args.clients, ingest))
    rows = [ours]
    theirs: dict[str, Any] | None = None
    if not args.skip_baseline:
        try:
            theirs = run_agl(n_agl, args.clients, min(ingest, 1000 if args.quick else 4000))
            rows.append(theirs)
        except BaselineUnavailable as exc:
            print(f"baseline agentlightning 1.0.2 unavailable: {exc}; no ratio is printed")
    report(rows)
    print(
        f"span ingest over HTTP (reinforge, batches of {INGEST_BATCH}): "
        f"{_fmt(ours['ingest_spans_per_s'], 0)} spans/s (goal >= 10,000)"
    )
    print(
        "ingest CPU per span (reinforge): server "
        f"{_fmt(ours['server_cpu_us_per_span'], 0)} us, clients {_fmt(ours['client_cpu_us_per_span'], 0)} us"
    )
    print(f"lease p99 (reinforge): {_fmt(ours['lease_p99_ms'], 2)} ms (goal < 20 ms)")
    if theirs is not None and theirs["completed"] and ours["completed"] == n:
        ratio = ours["rollouts_per_s"] / theirs["rollouts_per_s"]
        print(
            f"completed rollouts/s: reinforge {ours['rollouts_per_s']:.1f} vs agentlightning "
            f"{theirs['rollouts_per_s']:.1f} -> {ratio:.2f}x (goal >= 10)"
        )
        print(f"RESULT store_rollouts_per_s_ratio={ratio:.2f}")


if __name__ == "__main__":
    main()
