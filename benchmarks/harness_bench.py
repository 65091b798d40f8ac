"""Which coding harnesses run unchanged through the gateway, and what the gateway adds per call.

    .venv/bin/python benchmarks/harness_bench.py

For each harness of docs/harnesses.md it runs three shipped Harbor tasks through the real gateway
and runner (each attempt in its sandbox), a scripted backend answering as a capable model would in
that harness's own format. A harness counts only when every task's tests pass (reward 1) and the
gateway answered no call with a 4xx/5xx. Prints

    RESULT harnesses_ok=<n>/4
    RESULT harness_gateway_ms harness=<name> calls=<k> p50=<ms> p95=<ms> e2e_p50=<ms>

`p50/p95`: the gateway's time per LLM call, measured around its ASGI app (request in to the last
byte out; the scripted backend answers at once, so this is the gateway's own work: auth, parsing,
prompt rendering and tokenizing, recording). `e2e_p50`: the same calls as the harness saw them:
for mini-swe-agent from its trajectory (it stamps each reply), which adds the sandbox's relay,
litellm and the HTTP client; for Claude Code its own API time per call (`duration_api_ms /
num_turns` of each run's result event), which adds the relay and its SDK; for Codex CLI and OpenCode
none is measured (nan).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reinforge.gateway.app import create_gateway_app
from reinforge.harnesses import (
    ClaudeCode,
    CodexCli,
    HarnessAgent,
    MiniSweAgent,
    OpenCode,
    bash_reply,
    load_task,
    load_tasks,
)
from reinforge.harnesses.harness import Harness
from reinforge.harnesses.mini_swe_agent import SUBMIT
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import Reply, ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.models import build_tokenizer
from reinforge.net.background import BackgroundServer
from reinforge.runner import Runner
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import RolloutSpec

TASKS_ROOT = Path(__file__).resolve().parents[1] / "examples" / "harnesses" / "tasks"
SECRET = "bench-gateway-secret-" + "x" * 16
HARNESSES = ["mini-swe-agent", "claude-code", "codex", "opencode"]


class Timed:
    """ASGI middleware: status and wall time of every request to the wrapped app."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.seen: list[tuple[str, int, float]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def timed_send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        await self.app(scope, receive, timed_send)
        self.seen.append((scope["path"], status, time.perf_counter() - started))


def _solution(task: str) -> str:
    lines = (TASKS_ROOT / task / "solution" / "solve.sh").read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith(("#", "set -")))


SCRIPTS = {
    "write-file": ["ls -la", _solution("write-file"), "cat hello.txt", SUBMIT],
    "fix-failing-test": [
        "cat calc.py",
        _solution("fix-failing-test"),
        "python -m pytest -q test_calc.py",
        SUBMIT,
    ],
    "add-cli-flag": ["cat greet.py", _solution("add-cli-flag"), "python greet.py --shout", SUBMIT],
}
INSTRUCTIONS = {name: load_task(TASKS_ROOT / name).instruction.strip() for name in SCRIPTS}


def _reply(request: GenerationRequest) -> str:
    messages = request.messages or []
    first_user = next(str(m["content"]) for m in messages if m["role"] == "user")
    task = next(name for name, text in INSTRUCTIONS.items() if text in first_user)
    step = sum(1 for m in messages if m["role"] == "assistant")
    return bash_reply(SCRIPTS[task][step])


def _e2e_ms(attempts: Path) -> list[float]:
    """Per call, from the trajectory: the reply's timestamp minus the previous message's."""
    out = []
    for path in attempts.glob("*/harness/trajectory.json"):
        messages = json.loads(path.read_text()).get("messages", [])
        stamps = [m.get("extra", {}).get("timestamp") for m in messages]
        for i, message in enumerate(messages):
            if message.get("role") == "assistant" and i and stamps[i] and stamps[i - 1]:
                out.append((stamps[i] - stamps[i - 1]) * 1000)
    return out


def _tool_reply(tool: str, key: str) -> Callable[[GenerationRequest], ScriptedReply]:
    """A harness's tool-call format: each mini-swe-agent command as a call of its shell tool (`tool`,
    the command under `key`), then a closing text."""

    def reply(request: GenerationRequest) -> ScriptedReply:
        messages = request.messages or []
        users = "\n".join(str(m["content"]) for m in messages if m["role"] == "user")
        task = next(name for name, text in INSTRUCTIONS.items() if text in users)
        step = sum(1 for m in messages if m["role"] == "assistant")
        commands = SCRIPTS[task][:-1]  # its end is a reply without a tool call, not a submit command
        if step >= len(commands):
            return ScriptedReply(text="Done.")
        arguments = {key: commands[step]} | ({"description": "Run it"} if key == "command" else {})
        return ScriptedReply(
            text=f"Step {step + 1}.", tool_calls=[ScriptedToolCall(name=tool, arguments=arguments)]
        )

    return reply


def _api_ms_per_call(attempts: Path) -> list[float]:
    """Per run, from Claude Code's result event: its API time divided by its calls."""
    out = []
    for path in attempts.glob("*/logs/harness.out"):
        for line in path.read_text().splitlines():
            event = json.loads(line) if line.startswith("{") else {}
            if event.get("type") == "result" and event.get("num_turns"):
                out.append(event["duration_api_ms"] / event["num_turns"])
    return out


async def _run(
    harness: Harness, reply: Callable[[GenerationRequest], Reply], route: str, run_dir: Path
) -> tuple[bool, list[float]]:
    """Three shipped tasks through the real gateway and runner: whether all passed with no gateway
    error, and the gateway's time (ms) for each call on `route`."""
    tokenizer = build_tokenizer([p.read_text() for p in TASKS_ROOT.rglob("*") if p.is_file()], vocab_size=400)
    store = MemoryStore()
    app = create_store_app(store, "bench-store-token-" + "s" * 16)
    gateway = Timed(create_gateway_app(store, ScriptedBackend(tokenizer, reply), SECRET))
    app.mount("/gateway", gateway)
    with BackgroundServer(app) as server:
        agent = HarnessAgent(
            harness,
            attempts_dir=run_dir / "attempts",
            tasks_root=TASKS_ROOT,
            hide=[run_dir],
            timeout_s=180,
        )
        specs = [RolloutSpec(task={"harbor_task": name}, max_attempts=1) for name in SCRIPTS]
        rollouts = await store.enqueue_rollouts(specs)
        await Runner(store, agent, server.url + "/gateway", SECRET, concurrency=3).run(
            max_rollouts=len(specs)
        )
        final = await store.wait_for_rollouts([r.rollout_id for r in rollouts], 60)
    rewards = [r.reward for r in final]
    errors = [s for s in gateway.seen if s[1] >= 400]
    calls = [s[2] * 1000 for s in gateway.seen if s[0].endswith(route)]
    ok = len(final) == len(specs) and all(r == 1.0 for r in rewards) and not errors
    if not ok:
        print(f"{harness.name}: rewards {rewards}, gateway errors {errors}")
    return ok, calls


async def _mini_swe_agent(run_dir: Path) -> tuple[bool, list[float], list[float]]:
    ok, calls = await _run(MiniSweAgent(step_limit=10), _reply, "/chat/completions", run_dir)
    return ok, calls, _e2e_ms(run_dir / "attempts")


async def _claude_code(run_dir: Path) -> tuple[bool, list[float], list[float]]:
    reply = _tool_reply("Bash", "command")
    ok, calls = await _run(ClaudeCode(max_turns=10), reply, "/v1/messages", run_dir)
    return ok, calls, _api_ms_per_call(run_dir / "attempts")


async def _codex(run_dir: Path) -> tuple[bool, list[float], list[float]]:
    ok, calls = await _run(CodexCli(), _tool_reply("exec_command", "cmd"), "/v1/responses", run_dir)
    return ok, calls, []


async def _opencode(run_dir: Path) -> tuple[bool, list[float], list[float]]:
    reply = _tool_reply("bash", "command")
    ok, calls = await _run(OpenCode(), reply, "/v1/chat/completions", run_dir)
    return ok, calls, []


RUNS = {
    "mini-swe-agent": _mini_swe_agent,
    "claude-code": _claude_code,
    "codex": _codex,
    "opencode": _opencode,
}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args()
    load_tasks(TASKS_ROOT)  # the shipped tasks are well formed
    ok = 0
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        for name in HARNESSES:
            if name not in RUNS:
                print(f"{name}: not supported yet (docs/harnesses.md)")
                continue
            started = time.perf_counter()
            passed, calls, e2e = asyncio.run(RUNS[name](Path(tmp) / name))
            ok += passed
            if not calls:  # not installed, or it never reached the gateway
                print(f"RESULT harness_gateway_ms harness={name} calls=0")
                continue
            q = statistics.quantiles(calls, n=20) if len(calls) >= 2 else [float("nan")] * 19
            print(
                f"RESULT harness_gateway_ms harness={name} calls={len(calls)} "
                f"p50={statistics.median(calls):.1f} p95={q[18]:.1f} "
                f"e2e_p50={statistics.median(e2e) if e2e else float('nan'):.1f} "
                f"wall_s={time.perf_counter() - started:.1f}"
            )
    print(f"RESULT harnesses_ok={ok}/{len(HARNESSES)}")


if __name__ == "__main__":
    main()
