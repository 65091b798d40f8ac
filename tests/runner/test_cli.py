"""`reinforge runner` end to end, and a runner that dies: its lease expires and another runner retries."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

import reinforge
from reinforge.runner import LLM, Runner
from reinforge.runner.cli import runner_command
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import AttemptQuery, AttemptStatus, RolloutStatus

from .conftest import GATEWAY_SECRET, STORE_TOKEN, Stack, enqueue, until, wait_final

RUNNER_MAIN = "import typer; from reinforge.runner.cli import runner_command; typer.run(runner_command)"


def _cli() -> typer.Typer:
    app = typer.Typer()
    app.command()(runner_command)
    return app


def test_cli_runs_a_command_agent_against_an_http_store(stack: Stack, tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        "import json, os\n"
        "task = json.loads(os.environ['REINFORGE_TASK'])\n"
        "print('REINFORGE_REWARD=' + str(task['v']))\n"
    )
    rollouts = asyncio.run(enqueue(stack.store, {"v": 0.5}, {"v": 1.5}))
    result = CliRunner().invoke(
        _cli(),
        [
            "--store", stack.store_url, "--store-token", STORE_TOKEN, "--gateway-secret", GATEWAY_SECRET,
            "--agent-cmd", f"{sys.executable} {script}", "--concurrency", "2", "--max-rollouts", "2",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "leased 2, succeeded 2, failed 0" in result.output
    done = asyncio.run(wait_final(stack.store, rollouts))
    assert [r.reward for r in done] == [0.5, 1.5]


def test_cli_rejects_bad_options_with_a_message() -> None:
    cli = _cli()
    base = ["--store", "memory://", "--gateway", "http://127.0.0.1:9"]
    result = CliRunner().invoke(cli, [*base, "--gateway-secret", "s"])
    assert result.exit_code == 2 and "exactly one of --agent" in result.output
    result = CliRunner().invoke(cli, [*base, "--agent-cmd", "true"], env={"REINFORGE_GATEWAY_SECRET": ""})
    assert result.exit_code == 2 and "--gateway-secret" in result.output
    result = CliRunner().invoke(cli, [*base, "--gateway-secret", "s", "--agent", "no_such_module_xyz:run"])
    assert result.exit_code == 2 and "cannot import agent module" in result.output
    result = CliRunner().invoke(cli, ["--store", "memory://", "--gateway-secret", "s", "--agent-cmd", "true"])
    assert result.exit_code == 2 and "--gateway is required" in result.output
    result = CliRunner().invoke(cli, [*base, "--gateway-secret", "s", "--agent", "json"])
    assert result.exit_code == 2 and "package.module:function" in result.output


async def test_a_killed_runner_s_rollout_is_retried_by_another_runner(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "slow_agent.py").write_text(
        "import time\n\ndef run(task, llm):\n    time.sleep(60)\n    return 0.0\n"
    )
    store = HttpStoreClient(stack.store_url, STORE_TOKEN)
    try:
        rollouts = await enqueue(store, {"q": 1})
        rollout_id = rollouts[0].rollout_id
        env = {k: v for k, v in os.environ.items() if not k.startswith("REINFORGE_")}
        proc = subprocess.Popen(
            [
                sys.executable, "-c", RUNNER_MAIN, "--store", stack.store_url, "--store-token", STORE_TOKEN,
                "--gateway-secret", GATEWAY_SECRET, "--agent", "slow_agent:run", "--lease-seconds", "1",
                "--runner-id", "doomed",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            async def leased_by_doomed() -> bool:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                attempts = (await store.query_attempts(AttemptQuery(rollout_id=rollout_id))).items
                return any(a.runner_id == "doomed" for a in attempts)

            await until(leased_by_doomed, timeout=60)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if proc.stdout:
                proc.stdout.close()

        @reinforge.agent
        async def quick(task: dict[str, Any], llm: LLM) -> float:
            return 1.0

        stats = await Runner(store, quick, stack.gateway_url, GATEWAY_SECRET, runner_id="survivor").run(
            max_rollouts=1
        )
        assert stats.succeeded == 1
        (done,) = await wait_final(store, rollouts)
        assert done.status == RolloutStatus.succeeded and done.reward == 1.0 and done.attempt_count == 2
        attempts = (await store.query_attempts(AttemptQuery(rollout_id=rollout_id))).items
        assert [(a.runner_id, a.status) for a in attempts] == [
            ("doomed", AttemptStatus.timeout),
            ("survivor", AttemptStatus.succeeded),
        ]
    finally:
        await store.close()


async def test_signals_stop_the_runner_first_gently_then_at_once(stack: Stack, tmp_path: Path) -> None:
    (tmp_path / "stuck_agent.py").write_text(
        "import time\n\ndef run(task, llm):\n    time.sleep(60)\n    return 0.0\n"
    )
    store = HttpStoreClient(stack.store_url, STORE_TOKEN)
    try:
        rollouts = await enqueue(store, {"q": 1})
        rollout_id = rollouts[0].rollout_id
        env = {k: v for k, v in os.environ.items() if not k.startswith("REINFORGE_")}
        env["REINFORGE_GATEWAY_SECRET"] = GATEWAY_SECRET  # the secret may come from the environment
        proc = subprocess.Popen(
            [
                sys.executable, "-c", RUNNER_MAIN, "--store", stack.store_url, "--store-token", STORE_TOKEN,
                "--agent", "stuck_agent:run", "--runner-id", "signalled",
            ],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:

            async def running() -> bool:
                return (await store.get_rollout(rollout_id)).status == RolloutStatus.running

            await until(running, timeout=60)
            proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.5)
            assert proc.poll() is None, "the first signal lets the running attempt finish"
            proc.send_signal(signal.SIGTERM)
            out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 130, out.decode()
        assert b"leased 1, succeeded 0, failed 1" in out
        rollout = await store.get_rollout(rollout_id)
        assert rollout.status == RolloutStatus.queued  # back in the queue for another runner
        (attempt,) = (await store.query_attempts(AttemptQuery(rollout_id=rollout_id))).items
        assert attempt.status == AttemptStatus.failed and attempt.error == "the runner stopped"
    finally:
        await store.close()


def test_a_runner_exits_when_its_parent_dies(tmp_path: Path) -> None:
    """`--exit-with-parent`: a trainer killed with SIGKILL leaves no runner process behind."""
    import time

    launcher = tmp_path / "launcher.py"
    launcher.write_text(
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-m', 'reinforge', 'runner', '--store',"
        " 'http://127.0.0.1:9', '--gateway-secret', 's', '--store-token', 't',"
        " '--agent', 'reinforge.demo.agent:calc_agent',"
        " '--exit-with-parent', str(os.getpid())])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(600)\n",
        encoding="utf-8",
    )
    parent = subprocess.Popen([sys.executable, str(launcher)], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child_pid = int(parent.stdout.readline())
    try:
        time.sleep(1.0)
        assert _alive(child_pid), "the runner keeps running while its parent lives"
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 30
        while _alive(child_pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _alive(child_pid), "the runner outlived its parent"
    finally:
        parent.kill()
        if _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped by its new parent, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False
