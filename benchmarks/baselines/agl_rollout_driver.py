"""Subprocess-agent rollouts through agentlightning 1.0.2's local controller; prints JSON on stdout.

Run by the baseline's venv against a running agentlightning server:
`.bench/agl-venv/bin/python benchmarks/baselines/agl_rollout_driver.py --url URL --upstream URL
--rollouts N`. It registers the upstream as the model server, enqueues N rollouts whose
`config.local.agent_class` is `agl_noop_agent:NoopAgent`, and runs agentlightning's own
`LocalReconciler` (pool of 50 processes as shipped; poll interval 1 s instead of the shipped 10 s,
the baseline's better case) until every rollout is terminal.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

from agentlightning.client import AgentLightningAsyncClient
from agentlightning.controller.local_reconciler import LocalReconciler
from omegaconf import OmegaConf

HERE = Path(__file__).resolve().parent


async def run(url: str, upstream: str, n: int, pool: int, poll: float) -> dict[str, object]:
    # The controller's workers inherit this environment; they import the agent from here.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))
    config = OmegaConf.create(
        {
            "runner_type": "local",
            "agl_server": {"url": url, "agent_url": None, "key": ""},
            "local_runner": {"maximum_size": pool, "poll_interval": poll},
        }
    )
    async with AgentLightningAsyncClient(base_url=url, timeout=60) as api:
        models = [{"model": "policy", "endpoint": upstream + "/v1"}]
        (await api.post("/api/models", json=models)).raise_for_status()
        local = {"agent_class": "agl_noop_agent:NoopAgent"}
        rollouts = [{"input": {"a": i, "b": i + 1}, "config": {"local": local}} for i in range(n)]
        (await api.post("/api/rollouts", json=rollouts)).raise_for_status()
        reconciler = LocalReconciler(api=api, config=config)
        started = time.perf_counter()
        task = asyncio.create_task(reconciler.run())
        while True:
            page = (await api.get("/api/rollouts/terminal", params={"limit": 1})).json()
            if page["total_terminal"] >= n:
                break
            await asyncio.sleep(0.05)
        elapsed = time.perf_counter() - started
        reconciler.stop()
        await task
        succeeded = len((await api.get("/api/rollouts", params={"state_in": "succeeded", "limit": n})).json())
    return {
        "system": "agentlightning 1.0.2",
        "rollouts": n,
        "pool": pool,
        "poll_interval": poll,
        "seconds": elapsed,
        "rollouts_per_s": n / elapsed,
        "succeeded": succeeded,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--rollouts", type=int, default=60)
    parser.add_argument("--pool", type=int, default=50)
    parser.add_argument("--poll-interval", type=float, default=1.0)
    args = parser.parse_args()
    result = asyncio.run(run(args.url, args.upstream, args.rollouts, args.pool, args.poll_interval))
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
