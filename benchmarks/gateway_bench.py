"""Latency a gateway adds to an LLM call: reinforge's gateway vs agentlightning 1.0.2's LLM proxy.

The same OpenAI-client calls (`openai` python client, `chat.completions.create`, a small prompt, one
call at a time) go, in one run, interleaved in blocks of 50 calls per target in a shuffled order
with a 100 ms pause after each block (see `measure` for why not call by call):
1. direct to a fast local upstream (`baselines/fast_upstream.py`: a bare asyncio OpenAI-compatible
   server answering a fixed completion with vLLM's token-id and logprob fields);
2. through reinforge's gateway (`create_gateway_app` + `UpstreamBackend` to that upstream, recording
   every call as a span into a SQLite store; served by uvicorn in its own process);
3. through agentlightning 1.0.2's server proxy (`/proxy/rollout/.../openai/v1`, recording into its
   in-memory store; its own process, its own Python 3.12 venv under `.bench/`).
A gateway's added latency is its p50 minus the direct p50. After the run the script checks that the
reinforge store holds one LLM span per call made through it. With `--floor`, a fourth target is a proxy
that only forwards each message's bytes (`baselines/forwarding_proxy.py`): what any Python gateway on
this loop and machine adds before doing any work of its own.

    .venv/bin/python benchmarks/gateway_bench.py [--quick] [--calls N] [--store sqlite|memory] [--floor]

Ends with `RESULT gateway_added_p50_ms=<ms>` and `RESULT gateway_overhead_ratio_vs_agl=<theirs/ours>`
(goals: <= 1 ms; >= 5).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import httpx
import openai
from _agl import BASELINES, AglServer, BaselineUnavailable, agl_python, free_port, wait_http
from _child_server import serve_until_stdin_closes
from baselines import event_loop
from baselines.procstat import cpu_seconds

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.gateway.app import create_gateway_app
from reinforge.inference.upstream import UpstreamBackend
from reinforge.store.factory import open_store
from reinforge.store.protocol import Store
from reinforge.types import RolloutSpec, SpanQuery

MESSAGES = [{"role": "user", "content": "What is 2 + 2? Answer with the number."}]
EXPECTED_REPLY = "The answer is 4."
SECRET = "gateway-bench-secret"


# -- the reinforge gateway, served from its own process --------------------------------------------


async def _prepare_attempt(store: Store) -> tuple[str, str]:
    """A running attempt for the calls to be recorded under."""
    await store.enqueue_rollouts([RolloutSpec(task={"question": "2 + 2"})])
    leased = await store.lease_rollouts("gateway-bench", lease_seconds=3600.0)
    return leased[0].rollout.rollout_id, leased[0].attempt.attempt_id


async def _count_spans(store: Store, attempt_id: str) -> int:
    page = await store.query_spans(SpanQuery(attempt_id=attempt_id, name=semconv.SPAN_LLM_CALL, limit=1))
    return page.total


def serve_gateway(upstream_url: str, store_url: str) -> None:
    """Child-process mode: serve the gateway until SIGTERM, then print how many spans it recorded.

    Store, app and server share one event loop, as they do under `reinforge` itself.
    """

    async def run() -> None:
        store = await open_store(store_url)
        _, attempt_id = await _prepare_attempt(store)
        backend = UpstreamBackend(upstream_url, "policy")
        app = create_gateway_app(store, backend, SECRET)
        port = int(os.environ["GATEWAY_BENCH_PORT"])
        print(json.dumps({"attempt_id": attempt_id}), flush=True)
        # Returns once stdin closes, after the app's shutdown flushed its spans.
        await serve_until_stdin_closes(app, port)
        spans = await _count_spans(store, attempt_id)
        await backend.aclose()
        await store.close()
        print(json.dumps({"spans": spans}), flush=True)

    event_loop.run(run)


class ReinforgeGateway:
    def __init__(self, upstream_url: str, store_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-gateway", upstream_url, "--store-url", store_url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "GATEWAY_BENCH_PORT": str(self.port)},
        )
        assert self._proc.stdout is not None
        first = self._proc.stdout.readline()
        if not first:
            raise RuntimeError("the reinforge gateway process exited during start-up; see its log above")
        self.attempt_id: str = json.loads(first)["attempt_id"]
        wait_http(self.url + "/health", proc=self._proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def base_url(self) -> str:
        return f"{self.url}/r/{self.attempt_id}/v1"

    def stop(self) -> int | None:
        """Stop the server (it flushes its spans first); returns the LLM spans the store holds."""
        out, _ = self._proc.communicate(timeout=60)  # closing its stdin is the stop signal
        for line in out.splitlines():
            if line.startswith("{"):
                spans: int | None = json.loads(line).get("spans")
                return spans
        return None


# -- measurement ------------------------------------------------------------------------------------


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Target:
    """One way to reach the upstream: its OpenAI client and the server process that answers it."""

    def __init__(self, client: openai.OpenAI, server_pid: int) -> None:
        self.client = client
        self.server_pid = server_pid
        self.latencies_ms: list[float] = []
        self.server_cpu_s = 0.0

    def call(self) -> float:
        started = time.perf_counter()
        reply = self.client.chat.completions.create(
            model="policy",
            messages=MESSAGES,  # type: ignore[arg-type]
            max_tokens=16,
        )
        took = (time.perf_counter() - started) * 1000
        if not reply.choices or reply.choices[0].message.content != EXPECTED_REPLY:
            raise RuntimeError(f"unexpected reply: {reply}")
        return took


BLOCK_CALLS = 50
"""Calls per target before switching to the next one."""
SETTLE_S = 0.1
"""Pause after a target's block: longer than the reinforge recorder's 50 ms linger, so the span
write it defers past its last response lands in its own block's CPU time, not in the next target's
calls."""


def measure(targets: dict[str, Target], calls: int, warmup: int, seed: int = 0) -> None:
    """Sequential calls, interleaved in blocks of `BLOCK_CALLS` per target in a random order each
    round, so that the swings of a loaded machine hit every target alike.

    Blocks, not single calls: interleaved call by call, every call starts right after another
    server's call, with its code and data pushed out of the CPU caches (agentlightning's proxy stack
    is large), and a path that crosses more processes pays more for it. In one pair of runs at load
    ~1.5-2.5, call by call gave direct 0.93 ms p50, reinforge +0.40 ms, agentlightning +1.84 ms; in
    blocks, direct 0.79 ms, reinforge +0.28 ms (as in a run without agentlightning at all, either
    way), agentlightning +1.57 to +1.88 ms. A gateway in use serves calls back to back, as in a
    block. The CPU time of the process that answered (gateway or upstream) is summed per target from
    the start of its block to the end of the pause after it.
    """
    for target in targets.values():
        for _ in range(warmup):
            target.call()
    time.sleep(SETTLE_S)
    rng = random.Random(seed)
    order = list(targets.values())
    for start in range(0, calls, BLOCK_CALLS):
        rng.shuffle(order)
        for target in order:
            cpu_before = cpu_seconds(target.server_pid) or 0.0
            for _ in range(min(BLOCK_CALLS, calls - start)):
                target.latencies_ms.append(target.call())
            time.sleep(SETTLE_S)
            target.server_cpu_s += (cpu_seconds(target.server_pid) or 0.0) - cpu_before


def _agl_target(server: AglServer, upstream_url: str) -> str:
    """Register the upstream with agentlightning's server and make a rollout to call under."""
    with httpx.Client(base_url=server.url, timeout=30) as api:
        models = [{"model": "policy", "endpoint": upstream_url + "/v1"}]
        api.post("/api/models", json=models).raise_for_status()
        created = api.post("/api/rollouts", json=[{"input": {"question": "2 + 2"}}])
        created.raise_for_status()
        rollout_id = created.json()[0]["rollout_id"]
        api.patch(
            f"/api/rollouts/{rollout_id}", json={"status": {"state": "running", "last_attempt_id": "0"}}
        ).raise_for_status()
    return f"{server.url}/proxy/rollout/{rollout_id}/attempt/0/mode/train/openai/v1"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer calls (under a minute)")
    parser.add_argument("--calls", type=int, help="measured calls per target (default 2000; quick 400)")
    parser.add_argument(
        "--store",
        choices=["sqlite", "memory"],
        default="sqlite",
        help="where the reinforge gateway records (default: SQLite, the durable default)",
    )
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument(
        "--floor", action="store_true", help="also measure a proxy that only forwards bytes (the floor)"
    )
    parser.add_argument("--serve-gateway", metavar="UPSTREAM_URL", help=argparse.SUPPRESS)
    parser.add_argument("--store-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_gateway:
        serve_gateway(args.serve_gateway, args.store_url)
        return
    calls = args.calls or (400 if args.quick else 2000)

    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    upstream = subprocess.Popen([sys.executable, str(BASELINES / "fast_upstream.py"), str(upstream_port)])
    cleanups: list[Any] = [upstream.terminate]
    try:
        wait_http(upstream_url + "/health", proc=upstream)
        with tempfile.TemporaryDirectory(prefix="reinforge-gateway-bench-") as tmp:
            store_url = f"sqlite:///{Path(tmp) / 'store.db'}" if args.store == "sqlite" else "memory://"
            ours = ReinforgeGateway(upstream_url, store_url)
            token = attempt_token(SECRET, ours.attempt_id)
            targets = {
                "direct": Target(
                    openai.OpenAI(base_url=upstream_url + "/v1", api_key="unused", max_retries=0),
                    upstream.pid,
                ),
                "reinforge": Target(
                    openai.OpenAI(base_url=ours.base_url(), api_key=token, max_retries=0), ours.pid
                ),
            }
            if args.floor:
                floor_port = free_port()
                floor = subprocess.Popen(
                    [
                        sys.executable,
                        str(BASELINES / "forwarding_proxy.py"),
                        str(upstream_port),
                        str(floor_port),
                    ]
                )
                cleanups.append(floor.terminate)
                wait_http(f"http://127.0.0.1:{floor_port}/health", proc=floor)
                targets["floor"] = Target(
                    openai.OpenAI(
                        base_url=f"http://127.0.0.1:{floor_port}/v1", api_key="unused", max_retries=0
                    ),
                    floor.pid,
                )
            if not args.skip_baseline:
                try:
                    agl = AglServer(agl_python())
                    cleanups.append(agl.stop)
                    agl_client = openai.OpenAI(
                        base_url=_agl_target(agl, upstream_url), api_key="unused", max_retries=0
                    )
                    targets["agentlightning"] = Target(agl_client, agl.pid)
                except BaselineUnavailable as exc:
                    print(f"baseline agentlightning 1.0.2 unavailable: {exc}; no ratio is printed")
            print(
                f"gateway_bench: {calls} sequential chat.completions per target, interleaved in blocks of "
                f"{BLOCK_CALLS}; reinforge recording into {args.store}; cpus={os.cpu_count()}",
                flush=True,
            )
            warmup = max(20, calls // 20)
            measure(targets, calls, warmup)
            recorded = ours.stop()
    finally:
        for cleanup in reversed(cleanups):
            cleanup()

    p50 = {name: statistics.median(t.latencies_ms) for name, t in targets.items()}
    print(
        f"{'target':<16}{'calls':>7}{'p50 ms':>9}{'p90 ms':>9}{'p99 ms':>9}{'added p50 ms':>14}"
        f"{'server CPU ms/call':>20}"
    )
    for name, t in targets.items():
        values = t.latencies_ms
        print(
            f"{name:<16}{len(values):>7}{p50[name]:>9.3f}{_percentile(values, 0.9):>9.3f}"
            f"{_percentile(values, 0.99):>9.3f}{p50[name] - p50['direct']:>14.3f}"
            f"{1000 * t.server_cpu_s / len(values):>20.3f}"
        )
    print("(server CPU: the answering process only; a gateway's own figure excludes the upstream's)")
    expected = len(targets["reinforge"].latencies_ms) + warmup
    print(f"reinforge store holds {recorded} LLM-call spans for {expected} calls made through the gateway")
    if recorded != expected:
        print("warning: the reinforge gateway did not record every call")
    added = p50["reinforge"] - p50["direct"]
    paired = statistics.median(
        g - d for g, d in zip(targets["reinforge"].latencies_ms, targets["direct"].latencies_ms, strict=True)
    )
    print(f"reinforge: added p50 {added:.3f} ms (median of per-call differences: {paired:.3f} ms)")
    print(f"RESULT gateway_added_p50_ms={added:.3f}")
    if "floor" in p50:
        floor_added = p50["floor"] - p50["direct"]
        print(
            f"a proxy that only forwards bytes adds {floor_added:.3f} ms p50: reinforge's own work on the "
            f"call's path is {added - floor_added:.3f} ms"
        )
    if "agentlightning" in p50:
        agl_added = p50["agentlightning"] - p50["direct"]
        ratio = agl_added / added if added > 0 else float("inf")
        print(
            f"agentlightning adds {agl_added:.3f} ms p50, reinforge {added:.3f} ms: "
            f"{ratio:.1f}x less (goal >= 5)"
        )
        print(f"RESULT gateway_overhead_ratio_vs_agl={ratio:.2f}")


if __name__ == "__main__":
    main()
