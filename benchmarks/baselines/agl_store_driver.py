"""The store workload against agentlightning 1.0.2's server; prints one JSON object on stdout.

Run by the baseline's venv: `.bench/agl-venv/bin/python benchmarks/baselines/agl_store_driver.py
--url http://127.0.0.1:PORT --rollouts N --clients 16 --ingest-spans M`.

agentlightning 1.0.2 has no lease call: its controller lists queued rollouts
(`GET /api/rollouts?state_in=queuing`) and claims one by patching it to `running` (a second claim of
the same rollout gets 409). Each client here does that, then posts the attempt's 6 `model_request`
events and one `reward` event (its API takes one event per request) and patches it to `succeeded`.
Request bodies are serialised once up front, so the client's own cost is as small as it can be.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from baselines.payload import SPAN_BYTES, agl_model_request, padded
from baselines.procstat import cpu_seconds

LLM_CALLS_PER_ROLLOUT = 6
ENQUEUE_BATCH = 500


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _enqueue(client: httpx.AsyncClient, n: int) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, ENQUEUE_BATCH):
        batch = [
            {"input": {"data_id": str(i), "question": f"what is {i} + {i}?"}}
            for i in range(start, min(n, start + ENQUEUE_BATCH))
        ]
        response = await client.post("/api/rollouts", json=batch)
        response.raise_for_status()
        ids.extend(item["rollout_id"] for item in response.json())
    return ids


async def _claim(client: httpx.AsyncClient, worker: int, running: bytes) -> tuple[str | None, float]:
    """List queued rollouts and patch one to running; (None, _) when the queue is empty."""
    started = time.perf_counter()
    while True:
        response = await client.get("/api/rollouts", params={"state_in": "queuing", "limit": 16})
        response.raise_for_status()
        queued = response.json()
        if not queued:
            return None, 0.0
        for k in range(len(queued)):
            rollout_id = queued[(worker + k) % len(queued)]["rollout_id"]
            patched = await client.patch(
                f"/api/rollouts/{rollout_id}", content=running, headers={"content-type": "application/json"}
            )
            if patched.status_code == 200:
                return rollout_id, (time.perf_counter() - started) * 1000
            if patched.status_code != 409:
                patched.raise_for_status()


async def _worker(url: str, worker: int, bodies: dict[str, bytes], lease_ms: list[float]) -> int:
    done = 0
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        while True:
            rollout_id, took = await _claim(client, worker, bodies["running"])
            if rollout_id is None:
                return done
            lease_ms.append(took)
            events = f"/api/rollouts/{rollout_id}/attempt/0/events"
            for _ in range(LLM_CALLS_PER_ROLLOUT):
                (await client.post(events, content=bodies["llm"], headers=headers)).raise_for_status()
            (await client.post(events, content=bodies["reward"], headers=headers)).raise_for_status()
            finished = await client.patch(
                f"/api/rollouts/{rollout_id}", content=bodies["succeeded"], headers=headers
            )
            finished.raise_for_status()
            done += 1


async def _ingest(url: str, rollout_ids: list[str], total: int, clients: int, body: bytes) -> float:
    """Post `total` model_request events from `clients` concurrent clients; returns seconds."""
    per_client = total // clients
    headers = {"content-type": "application/json"}

    async def one(c: int) -> None:
        async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
            for k in range(per_client):
                rollout_id = rollout_ids[(c * per_client + k) % len(rollout_ids)]
                response = await client.post(
                    f"/api/rollouts/{rollout_id}/attempt/1/events", content=body, headers=headers
                )
                response.raise_for_status()

    started = time.perf_counter()
    await asyncio.gather(*(one(c) for c in range(clients)))
    return time.perf_counter() - started


def _cpu(pid: int | None) -> float:
    return (cpu_seconds(pid) or 0.0) if pid else 0.0


async def run(url: str, n: int, clients: int, ingest_spans: int, server_pid: int | None) -> dict[str, object]:
    pad, event_bytes = padded(lambda p: len(json.dumps(agl_model_request(p)).encode()), SPAN_BYTES)
    llm_body = json.dumps(agl_model_request(pad)).encode()
    bodies = {
        "llm": llm_body,
        "reward": json.dumps({"event_type": "reward", "data": {"value": 1.0, "source": "agent"}}).encode(),
        "running": json.dumps({"status": {"state": "running", "last_attempt_id": "0"}}).encode(),
        "succeeded": json.dumps({"status": {"state": "succeeded"}}).encode(),
    }
    lease_ms: list[float] = []
    cpu_start = _cpu(server_pid)
    started = time.perf_counter()
    async with httpx.AsyncClient(base_url=url, timeout=120.0) as client:
        rollout_ids = await _enqueue(client, n)
    enqueued = time.perf_counter()
    counts = await asyncio.gather(*(_worker(url, w, bodies, lease_ms) for w in range(clients)))
    finished = time.perf_counter()
    cpu_finished = _cpu(server_pid)
    ingest_seconds = await _ingest(url, rollout_ids, ingest_spans, clients, llm_body) if ingest_spans else 0.0
    cpu_ingested = _cpu(server_pid)
    completed = sum(counts)
    ingested = (ingest_spans // clients) * clients
    return {
        "system": "agentlightning 1.0.2",
        "rollouts": n,
        "completed": completed,
        "clients": clients,
        "span_bytes": event_bytes,
        "enqueue_seconds": enqueued - started,
        "seconds": finished - started,
        "rollouts_per_s": completed / (finished - started),
        "lease_p50_ms": statistics.median(lease_ms) if lease_ms else None,
        "lease_p99_ms": _percentile(lease_ms, 0.99) if lease_ms else None,
        "ingest_spans": ingested,
        "ingest_seconds": ingest_seconds,
        "ingest_spans_per_s": ingested / ingest_seconds if ingest_seconds else None,
        "server_cpu_ms_per_rollout": 1000 * (cpu_finished - cpu_start) / max(1, completed),
        "server_cpu_us_per_span": 1e6 * (cpu_ingested - cpu_finished) / ingested if ingested else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--rollouts", type=int, default=5000)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--ingest-spans", type=int, default=0)
    parser.add_argument("--server-pid", type=int, help="the server's pid, for its CPU time (Linux)")
    args = parser.parse_args()
    result = asyncio.run(run(args.url, args.rollouts, args.clients, args.ingest_spans, args.server_pid))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
