"""The sandbox's limits, with real processes: an attempt cannot read another attempt's files or the
run folder's store token, reaches no port but the gateway's, and is killed, whole tree, at its time
limit."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from reinforge.errors import InvalidRequestError
from reinforge.harnesses import HarnessAgent, HarnessContext, default_sandbox, namespaces_available
from reinforge.harnesses.tasks import TASK_KEY
from reinforge.runner import LLM

from .conftest import TASKS_ROOT

pytestmark = pytest.mark.skipif(not namespaces_available(), reason="this machine has no user namespaces")


@dataclass(frozen=True)
class ShellHarness:
    """A stand-in harness: one shell script, run like a harness would be."""

    script: str
    name: str = "shell"
    address_space_mb: int | None = None

    def command(self, ctx: HarnessContext) -> list[str]:
        return ["sh", "-c", self.script]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"OPENAI_BASE_URL": ctx.base_url, "OPENAI_API_KEY": ctx.api_key}


def _llm(attempt: str, port: int) -> LLM:
    return LLM.for_attempt(f"http://127.0.0.1:{port}/gateway", attempt, "attempt-key", "m")


def _agent(run_dir: Path, script: str, timeout_s: float = 60) -> HarnessAgent:
    return HarnessAgent(
        ShellHarness(script),
        attempts_dir=run_dir / "attempts",
        tasks_root=TASKS_ROOT,
        hide=[run_dir],
        timeout_s=timeout_s,
    )


async def test_an_attempt_cannot_read_other_attempts_or_the_store_token(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    token = run_dir / "store.token"
    token.write_text("store-secret")
    task = {TASK_KEY: "write-file"}
    first = _agent(
        run_dir,
        "printf 'Hello, reinforge!\\n' > hello.txt; "
        "echo note > /dev/shm/rf-note; echo note > /var/tmp/rf-note",
    )
    assert await first.rollout(task, _llm("attempt-1", 9)) == 1.0
    other = run_dir / "attempts" / "attempt-1" / "work" / "hello.txt"
    assert other.read_text() == "Hello, reinforge!\n"
    thief = _agent(
        run_dir,
        f"cat {other} > loot.txt; cat {token} >> loot.txt; ls {run_dir} >> loot.txt; "
        "cat /proc/1/environ /dev/shm/rf-note /var/tmp/rf-note >> loot.txt; "
        "printf 'Hello, reinforge!\\n' > hello.txt",
    )
    # It still does its own task (reward 1) but read nothing that is not its own.
    assert await thief.rollout(task, _llm("attempt-2", 9)) == 1.0
    attempt = run_dir / "attempts" / "attempt-2"
    loot = (attempt / "work" / "loot.txt").read_text()
    assert "store-secret" not in loot and "Hello" not in loot and "store.token" not in loot
    err = (attempt / "logs" / "harness.err").read_text()
    assert err.count("No such file or directory") == 4, err
    assert not Path("/dev/shm/rf-note").exists() and not Path("/var/tmp/rf-note").exists()


async def test_the_network_reaches_the_gateway_only(tmp_path: Path) -> None:
    with socket.socket() as gateway, socket.socket() as other:
        for s in (gateway, other):
            s.bind(("127.0.0.1", 0))
            s.listen(4)
        gport, oport = gateway.getsockname()[1], other.getsockname()[1]
        probe = (
            "import socket, sys\n"
            "for port in sys.argv[1:]:\n"
            "    try:\n"
            "        socket.create_connection(('127.0.0.1', int(port)), timeout=2).close()\n"
            "        print(port, 'open')\n"
            "    except OSError as e:\n"
            "        print(port, 'closed')\n"
        )
        run_dir = tmp_path / "run"
        script = f"python - {gport} {oport} > net.txt <<'EOF'\n{probe}EOF\n"
        script += "printf 'Hello, reinforge!\\n' > hello.txt"
        agent = _agent(run_dir, script)
        assert await agent.rollout({TASK_KEY: "write-file"}, _llm("net", gport)) == 1.0
        seen = (run_dir / "attempts" / "net" / "work" / "net.txt").read_text().split("\n")
        assert seen[:2] == [f"{gport} open", f"{oport} closed"]


async def test_the_time_limit_kills_the_whole_tree(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    # Children in the background, one in a session of its own, all appending to a file forever.
    script = (
        "(while true; do echo a >> ticks; sleep 0.05; done) & "
        "setsid sh -c 'while true; do echo b >> ticks; sleep 0.05; done' & "
        "trap '' TERM; sleep 1000"
    )
    agent = _agent(run_dir, script, timeout_s=1.5)
    started = time.monotonic()
    reward = await agent.rollout({TASK_KEY: "write-file"}, _llm("slow", 9))
    assert time.monotonic() - started < 15
    assert reward == 0.0
    attempt = run_dir / "attempts" / "slow"
    result = (attempt / "result.json").read_text()
    assert '"harness_timed_out": true' in result
    ticks = attempt / "work" / "ticks"
    size = ticks.stat().st_size
    assert {"a", "b"} <= set(ticks.read_text().split())
    time.sleep(0.5)
    assert ticks.stat().st_size == size, "a process of the attempt outlived its time limit"


def test_unknown_or_unavailable_sandbox_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="unknown sandbox"):
        default_sandbox("docker")
    assert default_sandbox("none").name == "none"
    assert default_sandbox("auto").name == "namespaces"


async def test_the_memory_limit_stops_a_process_that_allocates_past_it(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    script = (
        "python -c 'bytearray(2 * 1024**3)' 2> alloc.txt; echo $? >> alloc.txt; "
        "printf 'Hello, reinforge!\\n' > hello.txt"
    )
    agent = HarnessAgent(
        ShellHarness(script), attempts_dir=run_dir / "attempts", tasks_root=TASKS_ROOT, memory_mb=1024
    )
    assert await agent.rollout({TASK_KEY: "write-file"}, _llm("mem", 9)) == 1.0
    alloc = (run_dir / "attempts" / "mem" / "work" / "alloc.txt").read_text()
    assert "MemoryError" in alloc and alloc.split()[-1] == "1"
