"""Subprocess agents that leave processes behind: the whole process group goes with the attempt."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from reinforge.runner import Runner
from reinforge.runner.command import CommandAgent
from reinforge.types import AttemptQuery, RolloutStatus

from .conftest import GATEWAY_SECRET, serve_stack
from .test_in_process_agents import _run_rollouts


def _alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped by its parent, counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _gone(pids: list[int], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while any(_alive(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


async def test_children_left_behind_by_a_finished_agent_are_killed(tokenizer: Any, tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    # Two children that would outlive the agent (one of them immune to SIGTERM), then a clean exit.
    command = (
        f"sleep 300 & echo $! >> {pid_file}; "
        f"sh -c 'trap \"\" TERM; sleep 300' & echo $! >> {pid_file}; "
        "echo REINFORGE_REWARD=1"
    )
    agent = CommandAgent(["sh", "-c", command], timeout_s=20)
    with serve_stack(tokenizer) as stack:
        [rollout] = await _run_rollouts(
            stack, Runner(stack.store, agent, stack.gateway_url, GATEWAY_SECRET), 1
        )
    assert rollout.status is RolloutStatus.succeeded and rollout.reward == 1.0
    pids = [int(line) for line in pid_file.read_text().split()]
    assert len(pids) == 2 and _gone(pids), [p for p in pids if _alive(p)]


async def test_a_hung_agent_and_its_children_are_killed_at_the_timeout(
    tokenizer: Any, tmp_path: Path
) -> None:
    pid_file = tmp_path / "pids"
    command = f"sleep 300 & echo $! >> {pid_file}; echo $$ >> {pid_file}; trap '' TERM; sleep 300"
    agent = CommandAgent(["sh", "-c", command], timeout_s=1.0, kill_grace_s=0.5)
    with serve_stack(tokenizer) as stack:
        runner = Runner(stack.store, agent, stack.gateway_url, GATEWAY_SECRET)
        [rollout] = await _run_rollouts(stack, runner, 1)
        attempts = (await stack.store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
    assert rollout.status is RolloutStatus.failed
    assert attempts[0].error == "timed out: the agent did not finish within 1.0s"
    pids = [int(line) for line in pid_file.read_text().split()]
    assert len(pids) == 2 and _gone(pids), [p for p in pids if _alive(p)]
    assert os.getpgid(0) != pids[1]  # the agent had its own process group, not the runner's
