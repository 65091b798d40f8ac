"""End-to-end rollout throughput: noop agents through store + runner + gateway.

The shape of a distributed reinforge run on one machine, three processes:
- the server: the store (SQLite) over HTTP with the gateway mounted at `/gateway`
  (`create_store_app` + `create_gateway_app`, as the trainer serves them), its backend an
  `UpstreamBackend` pointed at
- a fast local OpenAI-compatible upstream (`baselines/fast_upstream.py`), so no model time is counted;
- this process: a `Runner` leasing from the store over HTTP (`HttpStoreClient`) and running the agent.

Two agents, each measured on its own fresh store:
- in-process: an async function that makes one chat completion with the `openai` client at the
  attempt's gateway URL and returns reward 1.0;
- subprocess: `CommandAgent` running `baselines/noop_agent.py` (Python, stdlib only) per attempt,
  which makes the same call and prints `REINFORGE_REWARD=1.0`.
Throughput is N rollouts / the time from the runner's start to the last finished attempt; the script
then checks that every rollout succeeded and that the store holds one LLM-call span per rollout.
For comparison, agentlightning 1.0.2 (its own venv under `.bench/`) runs the same subprocess agent
through its own local controller (`baselines/agl_rollout_driver.py`); `--skip-baseline` skips it.

    .venv/bin/python benchmarks/rollout_bench.py [--quick] [--inprocess N] [--subprocess N]

Ends with `RESULT inprocess_rollouts_per_s=<x>` and `RESULT subprocess_rollouts_per_s=<y>`
(goals >= 200 and >= 20; the issue reports agentlightning 1.0.2 at 1.38/s in the same shape of run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import openai
from _agl import BASELINES, AglServer, BaselineUnavailable, agl_python, free_port, run_driver, wait_http
from _child_server import serve_until_stdin_closes
from baselines import event_loop
from baselines.procstat import cpu_seconds

from reinforge import semconv
from reinforge.gateway.app import create_gateway_app
from reinforge.inference.upstream import UpstreamBackend
from reinforge.runner import CommandAgent, Runner
from reinforge.runner.llm import LLM
from reinforge.stack.app import GATEWAY_MOUNT
from reinforge.store.factory import open_store
from reinforge.store.http.client import HttpStoreClient
from reinforge.store.http.server import create_store_app
from reinforge.types import RolloutQuery, RolloutSpec, RolloutStatus, SpanQuery

# -- the server process -----------------------------------------------------------------------------


def serve_spine(upstream_url: str, db_url: str) -> None:
    """Child-process mode: store + mounted gateway on one uvicorn server, until stdin closes."""

    async def run() -> None:
        store = await open_store(db_url)
        backend = UpstreamBackend(upstream_url, "policy")
        app = create_store_app(store, os.environ["BENCH_STORE_TOKEN"])
        app.mount(GATEWAY_MOUNT, create_gateway_app(store, backend, os.environ["BENCH_GATEWAY_SECRET"]))
        port = int(os.environ["BENCH_PORT"])
        await serve_until_stdin_closes(app, port)
        await backend.aclose()
        await store.close()

    event_loop.run(run)


class SpineServer:
    def __init__(self, upstream_url: str, db_url: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.token = secrets.token_urlsafe(16)
        self.secret = secrets.token_urlsafe(16)
        env = {
            **os.environ,
            "BENCH_PORT": str(self.port),
            "BENCH_STORE_TOKEN": self.token,
            "BENCH_GATEWAY_SECRET": self.secret,
        }
        self._proc = subprocess.Popen(
            [sys.executable, __file__, "--serve-spine", upstream_url, "--db", db_url],
            stdin=subprocess.PIPE,
            env=env,
        )
        wait_http(self.url + "/health", proc=self._proc)

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stop(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the stop signal: the server shuts down gracefully
            try:
                self._proc.wait(30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


# -- the agents -------------------------------------------------------------------------------------


def inprocess_agent(http_client: openai.DefaultAsyncHttpxClient) -> Any:
    """One chat completion through the attempt's endpoint, reward 1.0 when an answer came back.

    What a user writes: an `openai.AsyncOpenAI` client per attempt (each attempt has its own base URL
    and key), all sharing one httpx connection pool, as an agent serving many attempts at once
    would. Reusing one AsyncOpenAI via `with_options(base_url=..., api_key=...)` costs the same
    (measured: ~45 us either way per attempt); the client's own call, ~2 ms CPU, dominates.
    """

    async def noop(task: dict[str, Any], llm: LLM) -> float:
        client = openai.AsyncOpenAI(
            base_url=llm.base_url, api_key=llm.api_key, http_client=http_client, max_retries=0
        )
        reply = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}],
            max_tokens=16,
        )
        return 1.0 if reply.choices[0].message.content else 0.0

    return noop


# -- measurement ------------------------------------------------------------------------------------


def _cpu(pid: int) -> float:
    return cpu_seconds(pid) or 0.0


def _children_cpu() -> float:
    """CPU of this process's finished children (the subprocess agents; reaped by the runner)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


async def run_phase(upstream_url: str, kind: str, n: int, concurrency: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="reinforge-rollout-bench-") as tmp:
        server = SpineServer(upstream_url, f"sqlite:///{Path(tmp) / 'store.db'}")
        store = HttpStoreClient(server.url, server.token)
        http_client = openai.DefaultAsyncHttpxClient()
        try:
            specs = [RolloutSpec(task={"a": i, "b": i + 1}) for i in range(n)]
            await store.enqueue_rollouts(specs)
            agent: Any = (
                inprocess_agent(http_client)
                if kind == "in-process"
                else CommandAgent([sys.executable, "-S", str(BASELINES / "noop_agent.py")], timeout_s=60)
            )
            runner = Runner(
                store,
                agent,
                server.url + GATEWAY_MOUNT,
                server.secret,
                concurrency=concurrency,
                poll_seconds=0.5,
                model="policy",
                drain_timeout_s=120,
            )
            cpu_before = _cpu(server.pid), _cpu(os.getpid()), _children_cpu()
            started = time.perf_counter()
            stats = await runner.run(max_rollouts=n)
            elapsed = time.perf_counter() - started
            cpu_after = _cpu(server.pid), _cpu(os.getpid()), _children_cpu()
            succeeded = (
                await store.query_rollouts(RolloutQuery(statuses=[RolloutStatus.succeeded], limit=1))
            ).total
            llm_spans = (await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1))).total
        finally:
            await http_client.aclose()
            await store.close()
            server.stop()
    if stats.errors:
        print(f"{kind}: first errors: {stats.errors[:3]}")
    return {
        "kind": kind,
        "rollouts": n,
        "concurrency": concurrency,
        "seconds": elapsed,
        "rollouts_per_s": n / elapsed,
        "succeeded": succeeded,
        "llm_spans": llm_spans,
        "failed": stats.failed,
        "server_cpu_ms": 1000 * (cpu_after[0] - cpu_before[0]) / n,
        "runner_cpu_ms": 1000 * (cpu_after[1] - cpu_before[1]) / n,
        "agent_process_cpu_ms": 1000 * (cpu_after[2] - cpu_before[2]) / n,
    }


def run_agl(upstream_url: str, n: int) -> dict[str, Any] | None:
    """agentlightning 1.0.2 running the same subprocess-agent workload with its own controller."""
    try:
        python = agl_python()
        with AglServer(python) as server:
            return run_driver(
                python,
                "agl_rollout_driver.py",
                "--url",
                server.url,
                "--upstream",
                upstream_url,
                "--rollouts",
                str(n),
            )
    except BaselineUnavailable as exc:
        print(f"baseline agentlightning 1.0.2 unavailable: {exc}")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rollouts (under a minute)")
    parser.add_argument("--inprocess", type=int, help="in-process rollouts (default 3000; quick 500)")
    parser.add_argument("--subprocess", type=int, help="subprocess rollouts (default 300; quick 80)")
    parser.add_argument("--concurrency", type=int, default=64, help="runner concurrency, in-process")
    parser.add_argument("--subprocess-concurrency", type=int, default=8)
    parser.add_argument(
        "--baseline-rollouts", type=int, help="subprocess rollouts for agentlightning (default 100; quick 30)"
    )
    parser.add_argument("--skip-baseline", action="store_true")
    parser.add_argument("--serve-spine", metavar="UPSTREAM_URL", help=argparse.SUPPRESS)
    parser.add_argument("--db", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_spine:
        serve_spine(args.serve_spine, args.db)
        return
    n_in = args.inprocess or (500 if args.quick else 3000)
    n_sub = args.subprocess or (80 if args.quick else 300)

    upstream_port = free_port()
    upstream_url = f"http://127.0.0.1:{upstream_port}"
    upstream = subprocess.Popen([sys.executable, str(BASELINES / "fast_upstream.py"), str(upstream_port)])
    try:
        wait_http(upstream_url + "/health", proc=upstream)
        print(
            f"rollout_bench: noop agents, store (SQLite over HTTP) + gateway + runner; cpus={os.cpu_count()}",
            flush=True,
        )
        results = [
            asyncio.run(run_phase(upstream_url, "in-process", n_in, args.concurrency)),
            asyncio.run(run_phase(upstream_url, "subprocess", n_sub, args.subprocess_concurrency)),
        ]
        theirs = (
            None
            if args.skip_baseline
            else run_agl(upstream_url, args.baseline_rollouts or (30 if args.quick else 100))
        )
    finally:
        upstream.terminate()
        upstream.wait()
    print(
        f"{'agent':<12}{'rollouts':>9}{'concurrency':>12}{'seconds':>9}{'rollouts/s':>11}{'succeeded':>10}"
        f"{'LLM spans':>10}  CPU ms per rollout: server / runner / agent processes"
    )
    for r in results:
        print(
            f"{r['kind']:<12}{r['rollouts']:>9}{r['concurrency']:>12}{r['seconds']:>9.2f}"
            f"{r['rollouts_per_s']:>11.1f}{r['succeeded']:>10}{r['llm_spans']:>10}  "
            f"{r['server_cpu_ms']:.2f} / {r['runner_cpu_ms']:.2f} / {r['agent_process_cpu_ms']:.2f}"
        )
        if r["succeeded"] != r["rollouts"] or r["llm_spans"] != r["rollouts"]:
            print(f"warning: {r['kind']}: not every rollout succeeded with its LLM call recorded")
    if theirs is not None:
        print(
            f"agentlightning 1.0.2, subprocess agents through its local controller "
            f"(pool {theirs['pool']}, poll {theirs['poll_interval']} s): "
            f"{theirs['rollouts']} rollouts in {theirs['seconds']:.2f} s = "
            f"{theirs['rollouts_per_s']:.2f}/s ({theirs['succeeded']} succeeded); reinforge subprocess "
            f"{results[1]['rollouts_per_s'] / theirs['rollouts_per_s']:.1f}x that"
        )
    print(json.dumps({r["kind"]: round(r["rollouts_per_s"], 2) for r in results}))
    print(f"RESULT inprocess_rollouts_per_s={results[0]['rollouts_per_s']:.1f}")
    print(f"RESULT subprocess_rollouts_per_s={results[1]['rollouts_per_s']:.1f}")


if __name__ == "__main__":
    main()
