"""Runner scaling: rollouts/s with 1, 2 and 4 `reinforge runner` processes, and with 2 Ray actors.

All on loopback on this machine, shaped like a run with outside runners:
- the server: `reinforge store serve` (SQLite in a temporary run folder) with its gateway in front of
  scripted replies (`--scripted`), in its own process, as a user starts it;
- the runners: `reinforge runner --agent benchmarks._scale_agent:tool_agent` processes, started
  with the store token and gateway secret in their environment, each running `--concurrency C`
  attempts at once; then 2 Ray runner actors (`RayRunners` on a local Ray head bound to 127.0.0.1)
  with the same agent and concurrency;
- the agent: an LLM call, then a tool that waits 50 ms (I/O-bound), reward 1.

The process configurations run in rounds (1, 2, 4 runners; three rounds, two with --quick), each
warmed up (runners started, a first batch run through) and then timed: N rollouts enqueued at once,
the clock stopped when the store reports the last one final; every one must have succeeded. A
scaling ratio is taken within each round (the machine's other work changes less within one) and
the median over rounds reported; rates are medians too. The baseline is one runner process.

    .venv/bin/python benchmarks/scale_bench.py [--quick] [--rollouts N] [--concurrency C] [--skip-ray]
    .venv/bin/python benchmarks/scale_bench.py --async-only [--quick]     # the async section alone

Ends with `RESULT runner_scaling_2x=<rollouts/s with 2 runners / with 1>` (goal >= 1.8), and
`runner_scaling_4x`, `runners_{1,2,4}_rollouts_per_s`, `ray_2_actors_rollouts_per_s`,
`ray_2_actors_vs_2_processes`.

The async section (`benchmarks/_async_bench.py`, after the runner section or alone with
`--async-only`; `--skip-async` leaves it out): `Trainer.fit` on a calc-style agent whose tool latency
is heavy-tailed, synchronous and with `max_staleness = 2`, same model, seed and steps. Ends with
`RESULT async_speedup=<sync s/step / async s/step>` (goal >= 1.5) and `async_val_reward_gap` (the
held-out reward difference between the runs, goal <= 0.05).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.baselines.procstat import cpu_seconds  # noqa: E402

from reinforge.runner.ray_runners import RayRunners, RayRunnerSettings  # noqa: E402
from reinforge.store.http.client import HttpStoreClient  # noqa: E402
from reinforge.types import RolloutSpec, RolloutStatus  # noqa: E402

AGENT = "benchmarks._scale_agent:tool_agent"
REPLIES = ["Let me look that up with the tool.", "It costs 3."]


class Server:
    """`reinforge store serve` with a scripted gateway, in a temporary run folder."""

    def __init__(self, root: Path) -> None:
        self.run_dir = root / "run"
        replies = root / "replies.json"
        replies.write_text(json.dumps(REPLIES), encoding="utf-8")
        self.log = open(root / "serve.log", "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "reinforge", "store", "serve", "--run-dir", str(self.run_dir),
             "--port", "0", "--scripted", str(replies)],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_env(),
        )  # fmt: skip
        url_file = self.run_dir / "store.url"
        deadline = time.monotonic() + 60
        while not url_file.is_file():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the store server did not start; see {root / 'serve.log'}")
            time.sleep(0.05)
        self.url = url_file.read_text(encoding="utf-8").strip()
        self.token = (self.run_dir / "store.token").read_text(encoding="utf-8").strip()
        self.secret = (self.run_dir / "gateway.secret").read_text(encoding="utf-8").strip()

    def stop(self) -> None:
        _terminate(self.proc)
        self.log.close()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("REINFORGE_")}
    env["OMP_NUM_THREADS"] = "1"
    env["PYTHONPATH"] = str(REPO)
    return env | extra


def _terminate(proc: subprocess.Popen[bytes], grace_s: float = 20.0) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def runner_processes(server: Server, count: int, concurrency: int, logs: Path) -> Iterator[list[int]]:
    env = _env(REINFORGE_STORE_TOKEN=server.token, REINFORGE_GATEWAY_SECRET=server.secret)
    procs: list[subprocess.Popen[bytes]] = []
    files = []
    try:
        for i in range(count):
            files.append(open(logs / f"runner-{count}-{i}.log", "wb"))  # noqa: SIM115 (closed below)
            argv = [sys.executable, "-m", "reinforge", "runner", "--store", server.url, "--agent", AGENT,
                    "--concurrency", str(concurrency), "--runner-id", f"bench-{count}-{i}"]  # fmt: skip
            out = files[-1]
            procs.append(
                subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=out, stdin=subprocess.DEVNULL)
            )
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            _terminate(proc)
        for f in files:
            f.close()


@contextmanager
def ray_actors(server: Server, count: int, concurrency: int) -> Iterator[None]:
    import ray

    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        num_cpus=count,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}},
    )
    try:
        settings = RayRunnerSettings.model_validate(
            {
                "store_url": server.url,
                "store_token": server.token,
                "gateway_url": server.url + "/gateway",
                "gateway_secret": server.secret,
                "agent": AGENT,
                "concurrency": concurrency,
                "python_path": [str(REPO)],
            }
        )
        actors = RayRunners(settings, count, cpus_per_actor=1.0, id_prefix="bench-ray").start()
        try:
            yield
        finally:
            actors.stop()
    finally:
        ray.shutdown()


async def run_batch(server: Server, n: int, tag: str) -> float:
    """Enqueue `n` rollouts at once; seconds until the store reports every one final (all must succeed)."""
    store = HttpStoreClient(server.url, server.token)
    try:
        specs = [RolloutSpec(rollout_id=f"{tag}-{i}", task={"i": i}) for i in range(n)]
        began = time.perf_counter()
        ids = [r.rollout_id for r in await store.enqueue_rollouts(specs)]
        final = await store.wait_for_rollouts(ids, timeout_seconds=600)
        took = time.perf_counter() - began
    finally:
        await store.close()
    failed = [r for r in final if r.status != RolloutStatus.succeeded]
    if len(final) != n or failed:
        raise RuntimeError(f"{tag}: {len(final)} of {n} final, {len(failed)} not succeeded")
    return took


def _cpu(pids: list[int]) -> float:
    return sum(cpu_seconds(pid) or 0.0 for pid in pids)


def measure(
    server: Server, n: int, warmup: int, tag: str, runner_pids: list[int] | None = None, repeats: int = 3
) -> float:
    """The median rollouts/s of `repeats` timed batches of `n` (a loaded machine's other work comes
    and goes); also prints the CPU the server (and runner processes) spent per rollout, which says
    whether the machine's cores, not the runners, set the pace."""
    asyncio.run(run_batch(server, warmup, f"{tag}-warmup"))
    rates: list[float] = []
    for r in range(repeats):
        cpu_before = _cpu([server.proc.pid]), _cpu(runner_pids or [])
        took = asyncio.run(run_batch(server, n, f"{tag}-{r}"))
        server_ms = (_cpu([server.proc.pid]) - cpu_before[0]) / n * 1000
        runner_ms = (_cpu(runner_pids or []) - cpu_before[1]) / n * 1000
        rates.append(n / took)
        cpu = f"CPU/rollout: server {server_ms:.1f} ms" + (
            f", runners {runner_ms:.1f} ms" if runner_pids else ""
        )
        print(f"{tag:>22}: {n} rollouts in {took:6.2f} s = {rates[-1]:7.1f} rollouts/s ({cpu})", flush=True)
    return statistics.median(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rollouts per configuration")
    parser.add_argument("--rollouts", type=int, default=None, help="timed rollouts per configuration")
    parser.add_argument("--concurrency", type=int, default=4, help="attempts one runner runs at once")
    parser.add_argument("--skip-ray", action="store_true")
    parser.add_argument("--async-only", action="store_true", help="only the async-training section")
    parser.add_argument("--skip-async", action="store_true", help="leave the async-training section out")
    args = parser.parse_args()
    if not args.async_only:
        run_runner_section(args)
    if not args.skip_async:
        from benchmarks import _async_bench

        # 32 steps: long enough for both runs' held-out reward to settle, so the gap compares where
        # they end and not how early each one took off (that varies from run to run).
        steps, val_tasks = (8, 32) if args.quick else (32, 64)
        print(f"async: {steps} steps of 4 tasks x 4, sync vs max_staleness=2, {val_tasks} held-out tasks")
        for name, value in _async_bench.run(steps, val_tasks, rounds=1 if args.quick else 3).items():
            print(f"RESULT {name}={value:.3f}")


def run_runner_section(args: argparse.Namespace) -> None:
    n = args.rollouts or (100 if args.quick else 300)
    c = args.concurrency
    rounds = 2 if args.quick else 3
    print(f"agent: LLM call, 50 ms tool; {c} attempts per runner; {n} timed rollouts per batch", flush=True)
    by_count: dict[int, list[float]] = {1: [], 2: [], 4: []}
    ray_rate: float | None = None
    with tempfile.TemporaryDirectory(prefix="reinforge-scale-") as tmp:
        root = Path(tmp)
        server = Server(root)
        try:
            # Rounds of 1, 2, 4 in turn: each round's configurations meet about the same load from
            # the machine's other work, so the ratios are taken within a round.
            for r in range(rounds):
                for count in by_count:
                    with runner_processes(server, count, c, root) as pids:
                        tag = f"round {r + 1}: {count} runner(s)"
                        by_count[count].append(measure(server, n, 4 * count * c, tag, pids, repeats=1))
            if not args.skip_ray:
                with ray_actors(server, 2, c):
                    ray_rate = measure(server, n, 8 * c, "2 Ray actors", repeats=rounds)
        finally:
            server.stop()
    for count, rates in by_count.items():
        print(f"RESULT runners_{count}_rollouts_per_s={statistics.median(rates):.1f}")
    for count in (2, 4):
        ratios = [many / one for many, one in zip(by_count[count], by_count[1], strict=True)]
        print(f"RESULT runner_scaling_{count}x={statistics.median(ratios):.2f}")
    if ray_rate is not None:
        print(f"RESULT ray_2_actors_rollouts_per_s={ray_rate:.1f}")
        print(f"RESULT ray_2_actors_vs_2_processes={ray_rate / statistics.median(by_count[2]):.2f}")


if __name__ == "__main__":
    main()
