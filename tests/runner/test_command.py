"""Command agents in other languages and processes: environment, rewards, crashes, process groups."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import time
from pathlib import Path

import pytest

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import GenerationRequest
from reinforge.runner import CommandAgent, Runner
from reinforge.types import AttemptQuery, AttemptStatus, RolloutStatus, SpanQuery

from .conftest import GATEWAY_SECRET, REPLIES, STORE_TOKEN, Stack, enqueue, wait_final

NODE_AGENT = Path(__file__).parent / "node" / "agent.mjs"
PY = sys.executable


def _script(tmp_path: Path, name: str, body: str) -> list[str]:
    path = tmp_path / name
    path.write_text(body)
    return [PY, str(path)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped by its parent) counts as dead.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
async def test_node_agent_calls_and_reward_are_recorded(stack: Stack) -> None:
    agent = CommandAgent(["node", str(NODE_AGENT)], timeout_s=60)
    rollouts = await enqueue(
        stack.store, {"question": "what is 2 + 2?", "expected": "4"}, {"question": "2+2?", "expected": "5"}
    )
    stats = await Runner(stack.store, agent, stack.gateway_url, GATEWAY_SECRET, concurrency=2).run(
        max_rollouts=2
    )
    assert stats.succeeded == 2, stats.errors
    good, bad = await wait_final(stack.store, rollouts)
    assert (good.reward, bad.reward) == (1.0, 0.0)
    for rollout in (good, bad):
        spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        rewards = [s for s in spans if s.name == semconv.SPAN_FINAL_REWARD]
        assert len(calls) == 2 and len(rewards) == 1  # the reward posted to the reward URL
        eos = stack.backend.tokenizer.eos_token_id
        for call in calls:
            # The prompt ids are the backend's rendering of exactly the messages the agent sent.
            messages = call.attributes[semconv.ATTR_LLM_REQUEST]["messages"]
            expected_prompt = stack.backend.prompt_ids(GenerationRequest(messages=messages))
            assert call.attributes[semconv.ATTR_PROMPT_TOKEN_IDS] == expected_prompt
            # The completion ids are the backend's tokens of the reply the agent received.
            content = call.attributes[semconv.ATTR_LLM_RESPONSE]["choices"][0]["message"]["content"]
            assert content in REPLIES
            assert call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == [*stack.backend.encode(content), eos]
        assert rewards[0].attributes[semconv.ATTR_REWARD_VALUE] == rollout.reward


async def test_environment_holds_the_attempt_and_no_trainer_secrets(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REINFORGE_STORE_TOKEN", STORE_TOKEN)
    monkeypatch.setenv("REINFORGE_GATEWAY_SECRET", GATEWAY_SECRET)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "do-not-leak")
    monkeypatch.setenv("MY_SETTING", "passed")
    dump = tmp_path / "env.json"
    cmd = _script(
        tmp_path,
        "dump_env.py",
        "import json, os\n"
        f"json.dump(dict(os.environ), open({str(dump)!r}, 'w'))\n"
        "print('REINFORGE_REWARD=0.5')\n",
    )
    agent = CommandAgent(cmd, timeout_s=30, pass_env=["MY_SETTING"], env={"EXTRA": "1"})
    await stack.store.put_resources({"llm": {"model": "policy-v3"}, "prompt": "P"})
    rollouts = await enqueue(stack.store, {"question": "q", "n": 1})
    await Runner(stack.store, agent, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.succeeded and done.reward == 0.5

    env = json.loads(dump.read_text())
    attempt = (await stack.store.query_attempts(AttemptQuery(rollout_id=done.rollout_id))).items[0]
    root = f"{stack.gateway_url}/r/{attempt.attempt_id}"
    assert env["OPENAI_BASE_URL"] == stack.gateway_url + "/v1"  # shared; the key names the attempt
    assert env["OPENAI_API_KEY"] == attempt_token(GATEWAY_SECRET, attempt.attempt_id)
    assert env["OPENAI_MODEL"] == "policy-v3"
    assert json.loads(env["REINFORGE_TASK"]) == {"question": "q", "n": 1}
    assert json.loads(env["REINFORGE_RESOURCES"]) == {"llm": {"model": "policy-v3"}, "prompt": "P"}
    assert env["REINFORGE_RESOURCES_VERSION"] == "0"
    assert env["REINFORGE_REWARD_URL"] == root + "/reward"
    assert env["REINFORGE_ATTEMPT_ID"] == attempt.attempt_id
    assert env["REINFORGE_ROLLOUT_ID"] == done.rollout_id
    assert env["MY_SETTING"] == "passed" and env["EXTRA"] == "1"
    assert env["PATH"] == os.environ["PATH"]
    leaked = [k for k, v in env.items() if GATEWAY_SECRET in v or STORE_TOKEN in v or v == "do-not-leak"]
    assert leaked == []
    # The final reward from the stdout line is the attempt's stored reward, like a returned one.
    assert done.reward == 0.5
    spans = (await stack.store.query_spans(SpanQuery(rollout_id=done.rollout_id))).items
    assert [s for s in spans if s.name == semconv.SPAN_FINAL_REWARD] == []


async def test_a_crashed_command_is_retried(stack: Stack, tmp_path: Path) -> None:
    marker = tmp_path / "crashed-once"
    cmd = _script(
        tmp_path,
        "flaky.py",
        "import os, sys, pathlib\n"
        f"m = pathlib.Path({str(marker)!r})\n"
        "if not m.exists():\n"
        "    m.write_text(os.environ['REINFORGE_ATTEMPT_ID'])\n"
        "    print('segfault-ish failure', file=sys.stderr)\n"
        "    sys.exit(3)\n"
        "print('REINFORGE_REWARD=1')\n",
    )
    rollouts = await enqueue(stack.store, {})
    stats = await Runner(stack.store, CommandAgent(cmd, 30), stack.gateway_url, GATEWAY_SECRET).run(
        max_rollouts=2
    )
    assert (stats.failed, stats.succeeded) == (1, 1)
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.succeeded and done.reward == 1.0 and done.attempt_count == 2
    first = (await stack.store.query_attempts(AttemptQuery(rollout_id=done.rollout_id))).items[0]
    assert first.attempt_id == marker.read_text() and first.status == AttemptStatus.failed
    assert first.error is not None and "status 3" in first.error and "segfault-ish failure" in first.error


async def test_timeout_kills_the_whole_process_group(stack: Stack, tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    cmd = _script(
        tmp_path,
        "spawner.py",
        "import os, subprocess, sys, time\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{child.pid}}')\n"
        "time.sleep(60)\n",
    )
    rollouts = await enqueue(stack.store, {})
    started = time.monotonic()
    agent = CommandAgent(cmd, timeout_s=1.0, kill_grace_s=0.5)
    stats = await Runner(stack.store, agent, stack.gateway_url, GATEWAY_SECRET).run(max_rollouts=1)
    assert time.monotonic() - started < 15
    assert stats.timed_out == 1
    (done,) = await wait_final(stack.store, rollouts)
    assert done.status == RolloutStatus.failed and done.error is not None and "timed out" in done.error
    parent, grandchild = (int(p) for p in pids.read_text().split())
    for _ in range(100):
        if not _alive(parent) and not _alive(grandchild):
            break
        await asyncio.sleep(0.05)
    assert not _alive(parent) and not _alive(grandchild)


async def test_leftover_children_are_killed_when_the_agent_exits(tmp_path: Path) -> None:
    from reinforge.runner import LLM

    pid_file = tmp_path / "pid"
    cmd = _script(
        tmp_path,
        "daemon.py",
        "import subprocess, sys\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "print('REINFORGE_REWARD=2.5')\n",
    )
    llm = LLM.for_attempt("http://127.0.0.1:9", "a1", "key", "m")
    started = time.monotonic()
    result = await CommandAgent(cmd, 30).run({}, llm, rollout_id="r1", attempt_id="a1")
    assert time.monotonic() - started < 10  # the child holding stdout did not keep us waiting
    assert result.exit_code == 0 and result.reward == 2.5
    for _ in range(100):
        if not _alive(int(pid_file.read_text())):
            break
        await asyncio.sleep(0.05)
    assert not _alive(int(pid_file.read_text()))


async def test_command_agent_errors_are_clear(tmp_path: Path) -> None:
    from reinforge.runner import LLM, AgentProcessError

    llm = LLM.for_attempt("http://127.0.0.1:9", "a1", "key", "m")
    with pytest.raises(AgentProcessError, match="cannot start"):
        await CommandAgent([str(tmp_path / "missing")]).run({}, llm, rollout_id="r", attempt_id="a1")
    bad = _script(tmp_path, "bad.py", "print('REINFORGE_REWARD=lots')\n")
    with pytest.raises(AgentProcessError, match="bad REINFORGE_REWARD"):
        await CommandAgent(bad).run({}, llm, rollout_id="r", attempt_id="a1")
    with pytest.raises(InvalidRequestError, match="REINFORGE_TASK"):
        await CommandAgent(bad).run({"blob": "x" * 200_000}, llm, rollout_id="r", attempt_id="a1")
    with pytest.raises(InvalidRequestError, match="empty"):
        CommandAgent("")
    # A long line without a newline and a reward line last: the reward still counts.
    noisy = _script(
        tmp_path, "noisy.py", "import sys\nsys.stdout.write('x' * 300000 + '\\nREINFORGE_REWARD=-1.5')\n"
    )
    result = await CommandAgent(noisy).run({}, llm, rollout_id="r", attempt_id="a1")
    assert result.reward == -1.5 and len(result.stdout_tail) <= 8192


async def test_cancelling_a_rollout_kills_its_command(stack: Stack, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    cmd = _script(
        tmp_path,
        "sleeper.py",
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(str(os.getpid()))\ntime.sleep(60)\n",
    )
    rollouts = await enqueue(stack.store, {})
    runner = Runner(
        stack.store,
        CommandAgent(cmd, 60, kill_grace_s=0.5),
        stack.gateway_url,
        GATEWAY_SECRET,
        heartbeat_seconds=0.05,
    )
    run = asyncio.create_task(runner.run(max_rollouts=1))
    for _ in range(200):
        if pid_file.exists() and pid_file.read_text():
            break
        await asyncio.sleep(0.05)
    pid = int(pid_file.read_text())
    await stack.store.cancel_rollouts([rollouts[0].rollout_id])
    stats = await asyncio.wait_for(run, 15)
    assert stats.stopped == 1
    assert not _alive(pid)
