"""Runner actors on a real Ray cluster (a local head bound to 127.0.0.1, one per module), leasing from
a real store server over HTTP and finishing through its gateway."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from pydantic import SecretStr

from reinforge.errors import ReinforgeError
from reinforge.runner.ray_runners import RayRunners, RayRunnerSettings
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import AttemptQuery, AttemptStatus, RolloutStatus

from .conftest import GATEWAY_SECRET, STORE_TOKEN, Stack, enqueue

AGENT = "tests.runner.scale_agents:waiting_agent"
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """One local Ray head for the module (starting one costs seconds); its GCS address."""
    ray.init(
        address="local",
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        num_cpus=2,
        namespace="reinforge-tests",
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": REPO}},
    )
    try:
        yield str(ray.get_runtime_context().gcs_address)
    finally:
        ray.shutdown()


def _settings(stack: Stack, **kw: Any) -> RayRunnerSettings:
    return RayRunnerSettings(
        store_url=stack.store_url,
        store_token=SecretStr(STORE_TOKEN),
        gateway_url=stack.gateway_url,
        gateway_secret=SecretStr(GATEWAY_SECRET),
        agent=AGENT,
        python_path=[REPO],
        **kw,
    )


async def _succeeded_attempts(store: HttpStoreClient) -> tuple[Counter[str], Counter[AttemptStatus]]:
    attempts = (await store.query_attempts(AttemptQuery(limit=1000))).items
    succeeded = Counter(a.rollout_id for a in attempts if a.status == AttemptStatus.succeeded)
    return succeeded, Counter(a.status for a in attempts)


async def test_a_killed_actor_loses_no_rollout(ray_head: str, stack: Stack) -> None:
    store = HttpStoreClient(stack.store_url, STORE_TOKEN)
    actors = RayRunners(
        _settings(stack, concurrency=4, lease_seconds=1.5), 2, cpus_per_actor=0.5, id_prefix="ray-test"
    )
    try:
        await asyncio.to_thread(actors.start)
        rollouts = await enqueue(store, *({"value": i, "wait_s": 0.4} for i in range(24)), max_attempts=5)
        ids = [r.rollout_id for r in rollouts]
        # Kill actor 0 while it holds leases (4 attempts of 0.4 s each in flight).
        deadline = time.monotonic() + 60
        while (await store.counters()).attempts_by_status.get(AttemptStatus.succeeded, 0) < 4:
            assert time.monotonic() < deadline, "the actors never finished an attempt"
            await asyncio.sleep(0.05)
        victim = actors.actors[0]
        ray.kill(victim, no_restart=True)
        while len(await store.wait_for_rollouts(ids, 0.5)) < len(ids):
            assert time.monotonic() < deadline, "rollouts never finished after the kill"
            await asyncio.to_thread(actors.check)  # replaces the dead actor
        final = await store.wait_for_rollouts(ids, 1)
        succeeded, by_status = await _succeeded_attempts(store)
    finally:
        totals = await asyncio.to_thread(actors.stop)
        await store.close()
    assert {r.status for r in final} == {RolloutStatus.succeeded}
    assert sorted(r.reward for r in final) == [float(i) for i in range(24)]
    assert set(succeeded.values()) == {1} and set(succeeded) == set(ids)  # each exactly once
    # The victim's attempts ran out their leases and were retried by the others.
    assert by_status[AttemptStatus.timeout] >= 1
    assert totals.replaced == 1 and totals.lost == ["ray-test-0"]
    assert actors.runner_ids == [] and totals.succeeded + by_status[AttemptStatus.timeout] >= 20


def test_an_agent_the_actors_cannot_import_fails_start(ray_head: str, stack: Stack) -> None:
    settings = _settings(stack).model_copy(update={"agent": "tests.runner.scale_agents:no_such_agent"})
    actors = RayRunners(settings, 1, cpus_per_actor=0.5)
    with pytest.raises(ReinforgeError, match=r"could not start.*no_such_agent"):
        actors.start()


def test_cli_runs_runner_actors_on_a_cluster(ray_head: str, stack: Stack) -> None:
    rollouts = asyncio.run(enqueue(stack.store, *({"value": 2.0, "wait_s": 0.05} for _ in range(6))))
    env = {k: v for k, v in os.environ.items() if not k.startswith("REINFORGE_")}
    env |= {"REINFORGE_STORE_TOKEN": STORE_TOKEN, "REINFORGE_GATEWAY_SECRET": GATEWAY_SECRET}
    env["PYTHONPATH"] = REPO
    done = subprocess.run(
        [
            sys.executable, "-m", "reinforge", "runner", "--store", stack.store_url, "--agent", AGENT,
            "--ray", ray_head, "--num-runners", "2", "--ray-cpus-per-runner", "0.5", "--max-rollouts", "3",
            "--concurrency", "3",
        ],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "leased 6, succeeded 6, failed 0" in done.stdout and "2 Ray actors, 0 replaced" in done.stdout
    final = asyncio.run(stack.store.wait_for_rollouts([r.rollout_id for r in rollouts], 10))
    assert [r.reward for r in final] == [2.0] * 6
