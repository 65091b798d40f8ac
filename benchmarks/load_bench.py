"""Load: many concurrent simulated agents against one store server with its gateway, on loopback.

One `reinforge store serve` process (SQLite store, gateway mounted at /gateway, the scripted backend,
which answers in microseconds: what is measured is the store's and the gateway's own cost) and
`--drivers` driver processes, each a real `Runner` over `HttpStoreClient` with `--agents/--drivers`
concurrent agents. Each agent makes `--calls` chat calls through the OpenAI SDK, with a simulated
tool `--think-ms` (uniform 0..2x) between them, then returns reward 1. The parent keeps the queue
topped up for `--seconds`, then lets the drivers drain and checks the store:

- errors: calls that raised, rollouts that did not succeed, and calls made without an LLM span in
  the store (every answered call must be recorded): goal 0;
- latency of each call as the agent sees it (p50/p99); with the scripted backend this is the latency
  the gateway and store add;
- peak RSS (VmHWM) of the server and of each driver.

    .venv/bin/python benchmarks/load_bench.py [--agents 1000] [--seconds 60] [--drivers 4] [--quick]

Ends with `RESULT load_errors=<n> load_p50_ms=<ms> load_p99_ms=<ms> ...` (goal: 0 errors).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from reinforge import semconv
from reinforge.runner import LLM, Runner, agent, gateway_http_client
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery

_REPLIES = ["The answer is 4.", "Let me compute that: 2 + 2 = 4.", "4"]


# -- a driver process -------------------------------------------------------------------------------


def _peak_rss_mb(pid: int | str = "self") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _drive(url: str, agents: int, seconds: float, calls: int, think_s: float) -> dict[str, Any]:
    from openai import AsyncOpenAI

    latencies: list[float] = []
    errors: list[str] = []
    made = 0
    shared = AsyncOpenAI(
        base_url="http://127.0.0.1/unused", api_key="unused", http_client=gateway_http_client()
    )

    @agent(name="load")
    async def simulated(task: dict[str, Any], llm: LLM) -> float:
        nonlocal made
        client = shared.with_options(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        messages: list[dict[str, Any]] = [{"role": "user", "content": str(task["question"])}]
        for _ in range(calls):
            started = time.perf_counter()
            try:
                reply = await client.chat.completions.create(
                    model=llm.model,
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=16,
                )
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}"[:300])
                raise
            latencies.append((time.perf_counter() - started) * 1000)
            made += 1
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
            messages.append({"role": "user", "content": "and again?"})
            await asyncio.sleep(random.uniform(0, 2 * think_s))
        return 1.0

    store = HttpStoreClient(url, max_connections=32)
    runner = Runner(
        store,
        simulated,
        url + "/gateway",
        os.environ["REINFORGE_GATEWAY_SECRET"],
        concurrency=agents,
        poll_seconds=0.05,
        lease_seconds=120.0,
        drain_timeout_s=60.0,
    )
    # Imports and start-up take seconds on a busy machine: all drivers start the clock together.
    print("ready", flush=True)
    await asyncio.to_thread(sys.stdin.readline)
    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(seconds, stop.set)
    lags: list[float] = []

    async def watch_lag() -> None:
        """How late this driver's own loop wakes: latency a busy client adds, not the server."""
        while not stop.is_set():
            due = time.perf_counter() + 0.1
            await asyncio.sleep(0.1)
            lags.append((time.perf_counter() - due) * 1000)

    watcher = asyncio.create_task(watch_lag())
    stats = await runner.run(stop=stop)
    await watcher
    await store.close()
    return {
        "latencies_ms": [round(x, 3) for x in latencies],
        "calls": made,
        "errors": errors[:20],
        "error_count": len(errors),
        "succeeded": stats.succeeded,
        "failed": stats.failed + stats.timed_out,
        "runner_errors": stats.errors[:20],
        "peak_rss_mb": _peak_rss_mb(),
        "cpu_s": sum(os.times()[:2]),
        "loop_lag_ms": [round(x, 3) for x in lags],
    }


# -- the parent -------------------------------------------------------------------------------------


def _start_server(run_dir: Path) -> subprocess.Popen[bytes]:
    replies = run_dir / "replies.json"
    replies.write_text(json.dumps(_REPLIES))
    log = (run_dir / "server.log").open("wb")
    cmd = [sys.executable, "-m", "reinforge", "store", "serve", "--run-dir", str(run_dir), "--port", "0"]
    cmd += ["--scripted", str(replies), "--max-body-bytes", str(1 << 20)]
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def _wait_for_server(run_dir: Path, server: subprocess.Popen[bytes], timeout_s: float = 120.0) -> str:
    deadline = time.monotonic() + timeout_s
    url_file = run_dir / "store.url"
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"the store server exited: {(run_dir / 'server.log').read_text()[-2000:]}")
        if url_file.is_file() and (run_dir / "gateway.secret").is_file():
            url = url_file.read_text().strip()
            try:
                if httpx.get(url + "/health", timeout=2.0).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
        time.sleep(0.2)
    raise SystemExit("the store server did not come up")


async def _top_up(store: HttpStoreClient, until: float, queued_target: int) -> int:
    """Keep `queued_target` rollouts queued until `until`; returns how many were enqueued."""
    enqueued = 0
    while time.monotonic() < until:
        counters = await store.counters()
        queued = counters.rollouts_by_status.get(RolloutStatus.queued, 0)
        if queued < queued_target:
            n = queued_target - queued
            await store.enqueue_rollouts(
                [RolloutSpec(task={"question": f"{enqueued + i} + 2?"}) for i in range(n)]
            )
            enqueued += n
        await asyncio.sleep(0.5)
    return enqueued


async def _check_store(url: str, token: str) -> tuple[int, dict[str, int], list[float]]:
    """LLM spans recorded, rollouts by status, and the gateway's own time per call (from the
    request's arrival to its span, backend included) for the last 1,000 calls."""
    store = HttpStoreClient(url, token)
    try:
        page = await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1))
        last = await store.query_spans(
            SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1000, offset=max(0, page.total - 1000))
        )
        inside = [((s.end_time or s.start_time) - s.start_time) * 1000 for s in last.items]
        counters = await store.counters()
        return page.total, {s.value: n for s, n in counters.rollouts_by_status.items()}, inside
    finally:
        await store.close()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--drivers", type=int, default=4)
    parser.add_argument("--calls", type=int, default=3, help="LLM calls per rollout")
    parser.add_argument("--think-ms", type=float, default=1000.0, help="mean simulated tool time")
    parser.add_argument("--quick", action="store_true", help="100 agents for 10 s (a smoke run)")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        result = asyncio.run(_drive(args.child, args.agents, args.seconds, args.calls, args.think_ms / 1000))
        print(json.dumps(result))
        return
    if args.quick:
        args.agents, args.seconds, args.drivers = 100, 10.0, 2
    per_driver = [args.agents // args.drivers + (i < args.agents % args.drivers) for i in range(args.drivers)]

    with tempfile.TemporaryDirectory(prefix="reinforge-load-") as tmp:
        run_dir = Path(tmp)
        server = _start_server(run_dir)
        try:
            url = _wait_for_server(run_dir, server)
            token = (run_dir / "store.token").read_text().strip()
            env = dict(
                os.environ,
                REINFORGE_STORE_TOKEN=token,
                REINFORGE_GATEWAY_SECRET=(run_dir / "gateway.secret").read_text().strip(),
            )
            timing = [
                "--seconds",
                str(args.seconds),
                "--calls",
                str(args.calls),
                "--think-ms",
                str(args.think_ms),
            ]
            drivers = [
                subprocess.Popen(
                    [sys.executable, __file__, "--child", url, "--agents", str(n), *timing],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    env=env,
                )
                for n in per_driver
            ]
            for proc in drivers:
                assert proc.stdout is not None
                if proc.stdout.readline().strip() != b"ready":
                    raise SystemExit("a driver failed to start")
            started = time.monotonic()

            async def top_up() -> int:
                store = HttpStoreClient(url, token)
                try:
                    return args.agents * 2 + await _top_up(
                        store, started + args.seconds, queued_target=args.agents * 2
                    )
                finally:
                    await store.close()

            async def fill_then_go() -> int:
                store = HttpStoreClient(url, token)
                try:
                    await store.enqueue_rollouts(
                        [RolloutSpec(task={"question": f"warm {i}"}) for i in range(args.agents * 2)]
                    )
                finally:
                    await store.close()
                for proc in drivers:
                    assert proc.stdin is not None
                    proc.stdin.write(b"go\n")
                    proc.stdin.flush()
                return await top_up()

            enqueued = asyncio.run(fill_then_go())
            results = []
            for proc in drivers:
                out, _ = proc.communicate(timeout=args.seconds + 300)
                if proc.returncode != 0:
                    raise SystemExit(f"a driver exited with {proc.returncode}")
                results.append(json.loads(out.decode().strip().splitlines()[-1]))
            wall = time.monotonic() - started  # the run and the drain
            spans, by_status, inside = asyncio.run(_check_store(url, token))
            server_peak = _peak_rss_mb(server.pid)
            server_cpu = sum(psutil.Process(server.pid).cpu_times()[:2])
        finally:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()

    latencies = [x for r in results for x in r["latencies_ms"]]
    calls = sum(r["calls"] for r in results)
    call_errors = sum(r["error_count"] for r in results)
    failed = sum(r["failed"] for r in results)
    succeeded = sum(r["succeeded"] for r in results)
    unrecorded = max(0, calls - spans)
    errors = call_errors + failed + unrecorded
    print(
        f"{args.agents} agents in {args.drivers} drivers for {args.seconds:g} s "
        f"({wall:.0f} s with the drain): "
        f"{calls} calls ({calls / args.seconds:.0f}/s), {succeeded} rollouts succeeded, {failed} failed, "
        f"{enqueued} enqueued; store: {spans} LLM spans, rollouts by status {by_status}"
    )
    print(
        f"call latency ms: p50 {_percentile(latencies, 0.5):.2f} p90 {_percentile(latencies, 0.9):.2f} "
        f"p99 {_percentile(latencies, 0.99):.2f} max {max(latencies, default=float('nan')):.1f} "
        f"mean {statistics.fmean(latencies) if latencies else float('nan'):.2f}"
    )
    for i, r in enumerate(results):
        for message in r["errors"][:3] + r["runner_errors"][:3]:
            print(f"driver {i} error: {message}")
    drivers_peak = [r["peak_rss_mb"] for r in results]
    drivers_cpu = [r["cpu_s"] for r in results]
    lags = [x for r in results for x in r["loop_lag_ms"]]
    print(
        f"inside the gateway (arrival to span, last 1,000 calls) ms: p50 {_percentile(inside, 0.5):.2f} "
        f"p99 {_percentile(inside, 0.99):.2f}; drivers' event-loop lag ms: p50 {_percentile(lags, 0.5):.1f} "
        f"p99 {_percentile(lags, 0.99):.1f}"
    )
    print(f"peak RSS MB: server {server_peak:.0f}, drivers {', '.join(f'{x:.0f}' for x in drivers_peak)}")
    print(
        f"CPU seconds: server {server_cpu:.0f}, drivers {', '.join(f'{cpu:.0f}' for cpu in drivers_cpu)} "
        f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)"
    )
    print(
        f"RESULT load_errors={errors} load_p50_ms={_percentile(latencies, 0.5):.2f} "
        f"load_p99_ms={_percentile(latencies, 0.99):.2f} "
        f"load_gateway_p99_ms={_percentile(inside, 0.99):.2f} load_calls_per_s={calls / args.seconds:.0f} "
        f"load_server_peak_rss_mb={server_peak:.0f} load_driver_peak_rss_mb={max(drivers_peak):.0f}"
    )


if __name__ == "__main__":
    main()
