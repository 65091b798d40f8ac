"""`RunnerProcesses`: a dead runner child is restarted after a back-off under a new runner id; a
crash loop stops with the child's log quoted."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reinforge.training.runner_processes import (
    ChildDeath,
    RunnerCrashLoopError,
    RunnerProcesses,
    RunnerProcessSettings,
    RunnerRestartPolicy,
)


def _settings(tmp_path: Path, agent: str) -> RunnerProcessSettings:
    with socket.socket() as sock:  # a port nothing listens on: the child keeps retrying its leases
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return RunnerProcessSettings(
        agent=agent,
        store_url=f"http://127.0.0.1:{port}",
        store_token="token",
        gateway_url=f"http://127.0.0.1:{port}/gateway",
        gateway_secret="secret",
        concurrency=1,
        model="m",
        timeout_s=None,
        log_dir=tmp_path / "logs",
    )


def _poll_until(
    procs: RunnerProcesses, timeout_s: float, done: Callable[[list[ChildDeath]], bool]
) -> list[ChildDeath]:
    seen: list[ChildDeath] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        seen += procs.poll()
        if done(seen):
            return seen
        time.sleep(0.05)
    raise AssertionError(f"timed out; saw {seen}")


def test_a_killed_child_is_restarted_under_a_new_runner_id(tmp_path: Path) -> None:
    policy = RunnerRestartPolicy(backoff_s=0.2, crash_loop_deaths=3)
    procs = RunnerProcesses(
        _settings(tmp_path, "reinforge.demo.agent:calc_agent"), 1, id_prefix="t", restarts=policy
    )
    procs.start()
    try:
        [first] = procs.pids
        assert procs.runner_id(0) == "t-0"
        os.kill(first, signal.SIGKILL)
        deaths = _poll_until(procs, 30, lambda seen: bool(seen))
        [death] = deaths
        assert (death.pid, death.exit_code, death.runner_id) == (first, -9, "t-0")
        assert "killed by signal 9" in death.describe()
        assert death.restart_in_s == pytest.approx(0.2)
        assert procs.pids == []  # waiting out the back-off
        _poll_until(procs, 10, lambda _: bool(procs.pids))
        [second] = procs.pids
        assert second != first and procs.runner_id(0) == "t-0.1" and procs.restarted == 1
        assert "--- restarted as t-0.1 ---" in procs.log_path(0).read_text()
    finally:
        procs.stop(grace_s=5)
    assert procs.pids == [second] and not Path(f"/proc/{second}").exists()  # stopped and reaped


def test_a_child_that_keeps_dying_stops_the_run_with_its_log(tmp_path: Path) -> None:
    policy = RunnerRestartPolicy(backoff_s=0.05, crash_loop_deaths=2, crash_loop_window_s=600)
    procs = RunnerProcesses(
        _settings(tmp_path, "no_such_module_xyz:agent"), 1, id_prefix="t", restarts=policy
    )
    procs.start()
    try:
        with pytest.raises(RunnerCrashLoopError) as caught:
            _poll_until(procs, 120, lambda _: False)
    finally:
        procs.stop(grace_s=5)
    message = str(caught.value)
    assert "died 2 times within 600 s" in message
    assert "no_such_module_xyz" in message  # the child's own error, from its log
    assert "runner-0.log" in message
