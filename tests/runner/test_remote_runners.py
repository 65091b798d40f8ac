"""Runners from outside join runs, as a user starts them: real `reinforge` commands in subprocesses.

- A training run served with `serve` prints the command that joins it; runners started from that
  command join mid-fit and leave (one is SIGKILLed holding leases), and every rollout is trained on
  exactly one finished attempt.
- docs/store.md's two `reinforge store serve` on one PostgreSQL schema, with a `reinforge runner`
  on each (one as docs/agents.md writes it, one as `serve` prints it): every rollout finishes once.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import torch

from reinforge.algorithms import GRPO
from reinforge.models import build_tokenizer, tiny_llama
from reinforge.store.factory import open_store
from reinforge.store.http.client import HttpStoreClient
from reinforge.training import Trainer, TrainerConfig
from reinforge.types import AttemptQuery, AttemptStatus, RolloutQuery, RolloutSpec, RolloutStatus

from .scale_agents import llm_parity_agent

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_URL = "postgresql://root@127.0.0.1:5432/test"
TASKS = [{"task_id": f"t{i}", "question": f"{i}+{i}*2", "wait_s": 0.5} for i in range(12)]


def _user_env() -> dict[str, str]:
    """A shell user's environment: the venv's `reinforge` on PATH, no REINFORGE_* of ours."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("REINFORGE_")}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["OMP_NUM_THREADS"] = "1"
    return env


def _shell(command: str, log: Path, cwd: Path = REPO) -> subprocess.Popen[bytes]:
    """Run `command` as a user would paste it into bash; in its own process group (killed by PID)."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            ["bash", "-c", command],
            cwd=cwd,
            env=_user_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes], sig: signal.Signals = signal.SIGTERM, wait_s: float = 30) -> int:
    if proc.poll() is None:
        os.killpg(proc.pid, sig)
    try:
        return proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.wait()


def _wait_for(predicate: Any, what: str, timeout_s: float = 90.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


async def _all_attempts(store: Any) -> list[Any]:
    found: list[Any] = []
    offset: int | None = 0
    while offset is not None:
        page = await store.query_attempts(AttemptQuery(limit=1000, offset=offset))
        found += page.items
        offset = page.next_offset
    return found


async def _attempts(url: str, token: str | None = None) -> list[Any]:
    """Every attempt in the store at `url` (an HTTP server with its token, or a database URL)."""
    store = HttpStoreClient(url, token) if token is not None else await open_store(url)
    try:
        return await _all_attempts(store)
    finally:
        await store.close()


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    corpus = [f"{t['question']} = {i}" for i, t in enumerate(TASKS)] * 20
    return build_tokenizer(corpus, vocab_size=300)


def test_remote_runners_join_and_leave_a_running_fit(
    tokenizer: Any, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    torch.manual_seed(0)
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    run_dir = tmp_path / "run"
    config = TrainerConfig(
        run_dir=run_dir,
        progress=False,
        optim={"learning_rate": 1e-2},
        rollouts={"tasks_per_step": 2, "max_tokens": 6},
        runners={"count": 0, "concurrency": 4},  # no runner of its own: only joined ones
        engine={"max_batch_size": 16, "max_seq_len": 128},
        schedule={"max_steps": 3, "val_every": 0},
        checkpoints={"every": 0},
        serve={"host": "127.0.0.1", "port": 0},
    )
    trainer = Trainer(model, tokenizer, algorithm=GRPO(group_size=4), config=config)
    outcome: dict[str, Any] = {}

    def fit() -> None:
        try:
            outcome["result"] = trainer.fit(llm_parity_agent, TASKS)
        except BaseException as e:  # re-raised in the test's thread
            outcome["error"] = e

    fitting = threading.Thread(target=fit, daemon=True)
    fitting.start()
    printed = ""

    def join_command() -> str | None:
        nonlocal printed
        printed += capfd.readouterr().err
        found = re.search(r"runners join this run with\n\s+(.+)", printed)
        return found.group(1) if found else None

    command = _wait_for(join_command, "the printed join command")
    url = (run_dir / "store.url").read_text().strip()
    token = (run_dir / "store.token").read_text().strip()
    # The secrets reach the runner through its environment, read from the run folder's files.
    assert "--gateway-secret" not in command and "--store-token" not in command
    module = llm_parity_agent.__module__  # as pytest imported it: `runner.scale_agents` or `tests.runner...`
    assert f"--store {url}" in command and f"--agent {module}:llm_parity_agent" in command
    # The runners start where that module name is importable, as a user starts them in their project.
    project = Path(__file__).resolve().parents[module.count(".")]
    assert (run_dir / "gateway.secret").stat().st_mode & 0o077 == 0

    leaving = _shell(f"{command} --runner-id leaving --lease-seconds 3", tmp_path / "leaving.log", project)
    joined_late: subprocess.Popen[bytes] | None = None
    try:

        def attempts_by(who: str, status: AttemptStatus) -> int:
            if not fitting.is_alive():  # the fit ended early: show why, not a refused connection
                raise AssertionError(f"the fit ended: {outcome}")
            return sum(
                1 for a in asyncio.run(_attempts(url, token)) if (a.runner_id, a.status) == (who, status)
            )

        # The first runner alone runs step 1, and is SIGKILLed holding step 2's leases: the run stalls
        # until another runner joins, which runs the rest (the dead one's attempts once they expire).
        _wait_for(
            lambda: (
                attempts_by("leaving", AttemptStatus.succeeded) >= 8
                and attempts_by("leaving", AttemptStatus.running) > 0
            ),
            "the first runner in step 2",
        )
        _stop(leaving, signal.SIGKILL)
        joined_late = _shell(
            f"{command} --runner-id joined --lease-seconds 3", tmp_path / "joined.log", project
        )
        fitting.join(180)
        assert not fitting.is_alive(), "the fit did not end"
    finally:
        _stop(leaving, signal.SIGKILL)
        if joined_late is not None:
            _stop(joined_late)
    if "error" in outcome:
        raise outcome["error"]
    result = outcome["result"]
    assert result.steps == 3 and result.policy_version == 3
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["train/rollouts"] for r in steps] == [8, 8, 8]

    async def read_back() -> tuple[list[Any], list[Any]]:
        store = await open_store(f"sqlite:///{run_dir / 'store.db'}")
        try:
            return (await store.query_rollouts(RolloutQuery(limit=1000))).items, await _all_attempts(store)
        finally:
            await store.close()

    rollouts, attempts = asyncio.run(read_back())
    trained = [r for r in rollouts if r.status == RolloutStatus.succeeded]
    assert len(trained) == 24
    succeeded = Counter(a.rollout_id for a in attempts if a.status == AttemptStatus.succeeded)
    assert set(succeeded) == {r.rollout_id for r in trained} and set(succeeded.values()) == {1}
    runners = {a.runner_id for a in attempts if a.status == AttemptStatus.succeeded}
    assert runners == {"leaving", "joined"}
    # What the killed runner held ran out its lease and was run again by the one that joined.
    expired = [a for a in attempts if a.status == AttemptStatus.timeout]
    assert any(a.runner_id == "leaving" for a in expired)


def _pg_up() -> bool:
    try:
        with psycopg.connect(PG_URL, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


@pytest.fixture
def pg_schema() -> Iterator[str]:
    if not _pg_up():
        pytest.skip(f"PostgreSQL is not reachable at {PG_URL}")
    name = f"rf_join_{uuid.uuid4().hex[:10]}"
    try:
        yield name
    finally:
        with psycopg.connect(PG_URL, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.mark.postgres
def test_the_documented_two_servers_and_runners_finish_every_rollout(pg_schema: str, tmp_path: Path) -> None:
    db = f"{PG_URL}?schema={pg_schema}"
    servers = [
        _shell(
            f'reinforge store serve --run-dir {tmp_path}/exp1-{x} --db "{db}" --port 0',
            tmp_path / f"serve-{x}.log",
        )
        for x in ("a", "b")
    ]
    runners: list[subprocess.Popen[bytes]] = []
    try:
        urls = [
            _wait_for(lambda x=x: (tmp_path / f"exp1-{x}" / "store.url").is_file(), f"server {x}")
            and (tmp_path / f"exp1-{x}" / "store.url").read_text().strip()
            for x in ("a", "b")
        ]
        agent_cmd = "sh -c 'echo REINFORGE_REWARD=1'"
        token = (tmp_path / "exp1-a" / "store.token").read_text().strip()

        async def enqueue_and_wait(first: int) -> list[Any]:
            store = HttpStoreClient(urls[0], token)  # both servers share the queue: either would do
            try:
                specs = [RolloutSpec(rollout_id=f"r{i}", task={"i": i}) for i in range(first, first + 100)]
                ids = [r.rollout_id for r in await store.enqueue_rollouts(specs)]
                return list(await store.wait_for_rollouts(ids, 90))
            finally:
                await store.close()

        # Phase 1: server b's runner alone, from the command `serve` printed (the agent filled in).
        printed = (tmp_path / "serve-b.log").read_text()
        join = re.search(r"a runner joins with:\n\s+(.+)", printed)
        assert join is not None, printed
        command = join.group(1).replace(
            "--agent MODULE:FUNCTION", f'--agent-cmd "{agent_cmd}" --concurrency 8'
        )
        runners.append(_shell(command + " --runner-id runner-b", tmp_path / "runner-b.log"))
        final = asyncio.run(enqueue_and_wait(0))
        assert _stop(runners[0]) == 0  # SIGTERM: a graceful stop
        # Phase 2: server a's runner alone, as docs/agents.md writes it (secrets in shell variables).
        token_a = f"$(cat {tmp_path}/exp1-a/store.token)"
        secret_a = f"$(cat {tmp_path}/exp1-a/gateway.secret)"
        runners.append(
            _shell(
                f'TOKEN="{token_a}"; SECRET="{secret_a}"; reinforge runner --store {urls[0]} '
                f'--store-token "$TOKEN" --gateway {urls[0]}/gateway --gateway-secret "$SECRET" '
                f'--agent-cmd "{agent_cmd}" --concurrency 8 --runner-id runner-a',
                tmp_path / "runner-a.log",
            )
        )
        final += asyncio.run(enqueue_and_wait(100))
    finally:
        for proc in [*runners, *servers]:
            _stop(proc)
    assert len(final) == 200 and {r.status for r in final} == {RolloutStatus.succeeded}
    assert {r.reward for r in final} == {1.0}
    attempts = asyncio.run(_attempts(db))
    succeeded = Counter(a.rollout_id for a in attempts if a.status == AttemptStatus.succeeded)
    assert len(succeeded) == 200 and set(succeeded.values()) == {1}
    by_runner = Counter(a.runner_id for a in attempts if a.status == AttemptStatus.succeeded)
    assert by_runner == {"runner-b": 100, "runner-a": 100}
    logs = [(tmp_path / f"runner-{x}.log").read_text() for x in ("a", "b")]
    assert all("runner done" in log for log in logs), logs


def test_serve_refuses_backend_options_that_do_not_fit(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from reinforge.cli import app

    base = ["store", "serve", "--run-dir", str(tmp_path / "run"), "--port", "0"]
    two = CliRunner().invoke(app, [*base, "--scripted", "r.json", "--upstream", "http://127.0.0.1:9"])
    assert two.exit_code == 2 and "at most one backend; got --upstream and --scripted" in two.output
    nameless = CliRunner().invoke(app, [*base, "--upstream", "http://127.0.0.1:9"])
    assert nameless.exit_code == 2 and "--upstream needs --upstream-model" in nameless.output
    (tmp_path / "bad.json").write_text("{}")
    bad = CliRunner().invoke(app, [*base, "--scripted", str(tmp_path / "bad.json")])
    assert bad.exit_code == 1 and "expected a non-empty JSON list of replies" in bad.output
    assert not (tmp_path / "run" / "store.url").exists()  # nothing was left claiming to serve


def test_trainer_settings_for_outside_runners_are_checked() -> None:
    served = TrainerConfig(serve={"host": "0.0.0.0", "port": 8765}, runners={"count": 0})
    assert served.serve is not None and served.runners.slots == 0 and not served.runners.out_of_process
    with pytest.raises(ValueError, match=r"runners.count = 0 starts no runner: set \[trainer.serve\]"):
        TrainerConfig(runners={"count": 0})
    on_ray = TrainerConfig(runners={"concurrency": 8, "ray": {"address": "auto", "actors": 3}})
    assert on_ray.runners.slots == 24 and on_ray.runners.out_of_process
    with pytest.raises(ValueError, match=r"runners\.processes or runners\.ray, not both"):
        TrainerConfig(runners={"processes": 2, "ray": {}})
    with pytest.raises(ValueError, match="port"):
        TrainerConfig(serve={"port": 70000})
