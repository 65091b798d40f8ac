"""`HarnessAgent`: a coding harness as a trainable agent, one Harbor task per rollout.

Per attempt: the task's environment files are copied into the attempt's own directory, the harness
runs there (sandboxed, pointed at the gateway with the attempt's key, within the task's time limit),
then the task's tests run there (sandboxed, no network) and their result is the reward. Everything
the attempt leaves is kept under `attempts_dir/<attempt id>/`: `work/` (the files as the harness left
them), `harness/` (its home: config, trajectory), `logs/` (both commands' output, the verifier's
reports) and `result.json`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from reinforge import semconv
from reinforge.harnesses.harness import Harness, HarnessContext, ToolFailure
from reinforge.harnesses.sandbox import Limits, RunResult, Sandbox, default_sandbox
from reinforge.harnesses.tasks import HarborTask, task_from_rollout
from reinforge.harnesses.verifier import RewardMode, TestOutcome, score
from reinforge.runner.agent import Agent
from reinforge.runner.llm import LLM
from reinforge.tracing.context import current_attempt
from reinforge.types import Span, SpanKind, SpanStatus, SpanStatusCode

log = logging.getLogger(__name__)

_BASE_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TERM")


@dataclass(frozen=True)
class AttemptReport:
    """What one attempt did, as written to its `result.json`."""

    task: str
    harness: str
    sandbox: str
    harness_exit_code: int
    harness_timed_out: bool
    tests: TestOutcome


def report_tool_failures(harness: Harness, state_dir: Path) -> int:
    """Each failed tool call the harness's own records hold (`tool_failures`, where it has one) as a
    tool span with error status and an AIR `tool_error`, timed when the tool ended: credit charges it
    to the call that asked for the tool, as the gateway does for Anthropic's `is_error` results."""
    read = getattr(harness, "tool_failures", None)
    attempt = current_attempt()
    if read is None or attempt is None:
        return 0
    try:
        failures: list[ToolFailure] = read(state_dir)
    except (OSError, ValueError) as exc:  # an unreadable record is no signal, not a failed attempt
        log.warning("%s: its tool records could not be read: %s", harness.name, exc)
        return 0
    for failure in failures:
        attributes: dict[str, Any] = {
            semconv.ATTR_STEP_KIND: semconv.STEP_TOOL,
            semconv.ATTR_TOOL_NAME: failure.tool,
            semconv.ATTR_TOOL_CALL_ID: failure.call_id,
            semconv.ATTR_AIR_SIGNAL: semconv.AIR_TOOL_ERROR,
            semconv.ATTR_SEQUENCE_IN_ATTEMPT: attempt.next_sequence(),
        }
        if attempt.agent_name is not None:
            attributes[semconv.ATTR_AGENT_NAME] = attempt.agent_name
        message = f"{harness.name} recorded {failure.tool} as failed"
        attempt.sink.submit(
            Span(
                rollout_id=attempt.rollout_id,
                attempt_id=attempt.attempt_id,
                name=semconv.SPAN_TOOL_RESULT,
                kind=SpanKind.internal,
                start_time=failure.ended_at,
                end_time=failure.ended_at,
                attributes=attributes,
                status=SpanStatus(code=SpanStatusCode.error, message=message),
            )
        )
    return len(failures)


def _attempt_id(llm: LLM) -> str:
    if "/r/" in llm.attempt_root:
        return unquote(llm.attempt_root.rsplit("/r/", 1)[1])
    return "local-" + os.urandom(6).hex()


def _safe_name(text: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in text)[:120] or "attempt"


class HarnessAgent(Agent):
    """Runs `harness` on the Harbor task each rollout names (`{"harbor_task": <folder>}`).

    `hide` adds paths the attempt must not see (the run folder, with the store's token); the attempts'
    folder, the task folders, the temp folder and $HOME are always hidden. `timeout_s` caps the
    task's own agent time limit; `memory_mb` caps each process's address space.
    """

    def __init__(
        self,
        harness: Harness,
        *,
        attempts_dir: str | Path,
        tasks_root: str | Path | None = None,
        sandbox: Sandbox | str = "auto",
        reward_mode: RewardMode | str = RewardMode.fraction,
        hide: Sequence[str | Path] = (),
        timeout_s: float | None = None,
        memory_mb: int | None = 4096,
        name: str | None = None,
    ) -> None:
        self.harness = harness
        self.attempts_dir = Path(attempts_dir).resolve()
        self.tasks_root = Path(tasks_root).resolve() if tasks_root is not None else None
        self.sandbox = default_sandbox(sandbox) if isinstance(sandbox, str) else sandbox
        self.reward_mode = RewardMode(reward_mode)
        self.extra_hide = [Path(p).resolve() for p in hide]
        self.harness_timeout_s = timeout_s
        self.memory_mb = memory_mb
        self.name = name

    def _hidden(self, task: HarborTask) -> list[Path]:
        candidates = [self.attempts_dir, task.path.parent, Path(tempfile.gettempdir()), *self.extra_hide]
        # Scratch space every process shares: a note left there by one attempt is read by none.
        candidates += [p for p in (Path("/tmp"), Path("/var/tmp"), Path("/dev/shm")) if p.is_dir()]
        if self.tasks_root is not None:
            candidates.append(self.tasks_root)
        if home := os.environ.get("HOME"):
            candidates.append(Path(home))
        return [p.resolve() for p in candidates]

    def _env(self, home: Path) -> dict[str, str]:
        env = {k: os.environ[k] for k in _BASE_ENV if k in os.environ}
        bin_dir = str(Path(sys.executable).parent)
        env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "/usr/local/bin:/usr/bin:/bin")
        env["HOME"] = str(home)
        env["TMPDIR"] = "/tmp"
        return env

    async def rollout(self, task: dict[str, Any], llm: LLM) -> float:
        harbor = task_from_rollout(task, self.tasks_root)
        root = self.attempts_dir / _safe_name(_attempt_id(llm))
        if root.exists():
            shutil.rmtree(root)
        work, state, logs, tests = root / "work", root / "harness", root / "logs", root / "tests"
        harbor.copy_environment(work)
        state.mkdir(parents=True)
        hide = self._hidden(harbor)
        timeout = harbor.agent_timeout_s
        if self.harness_timeout_s is not None:
            timeout = min(timeout, self.harness_timeout_s)
        caps = [m for m in (self.memory_mb, harbor.memory_mb) if m]
        memory = min(caps) if caps else None
        # A harness written before `address_space_mb` joined the protocol has none: it needs no floor.
        floor = getattr(self.harness, "address_space_mb", None)
        if memory is not None and floor:
            memory = max(memory, floor)
        ctx = HarnessContext(
            instruction=harbor.instruction,
            base_url=self.sandbox.inside_url(llm.base_url),
            api_key=llm.api_key,
            model=llm.model,
            workdir=work,
            state_dir=state,
            timeout_s=timeout,
        )
        ran = await self.sandbox.run(
            self.harness.command(ctx),
            cwd=work,
            env={**self._env(state), **self.harness.env(ctx)},
            writable=[work, state],
            hide=hide,
            limits=Limits(timeout_s=timeout, memory_mb=memory),
            logs=logs,
            log_name="harness",
            gateway_url=llm.base_url,
        )
        report_tool_failures(self.harness, state)
        if ran.timed_out:
            log.warning(
                "%s on %s ran out of its %ss; its tests run anyway", self.harness.name, harbor.name, timeout
            )
        outcome = await self.run_tests(harbor, work=work, tests=tests, logs=logs, hide=hide, home=state)
        report = AttemptReport(
            task=harbor.name,
            harness=self.harness.name,
            sandbox=self.sandbox.name,
            harness_exit_code=ran.exit_code,
            harness_timed_out=ran.timed_out,
            tests=outcome,
        )
        (root / "result.json").write_text(json.dumps(asdict(report), indent=2))
        return outcome.reward

    async def run_tests(
        self, harbor: HarborTask, *, work: Path, tests: Path, logs: Path, hide: Sequence[Path], home: Path
    ) -> TestOutcome:
        """Copy the task's tests in (only now: the harness never saw them) and score the run."""
        if tests.exists():
            shutil.rmtree(tests)
        shutil.copytree(harbor.tests_dir, tests)
        verifier_logs = logs / "verifier"
        verifier_logs.mkdir(parents=True, exist_ok=True)
        env = self._env(home)
        env.update({"TESTS_DIR": str(tests), "LOGS_DIR": str(verifier_logs), "PYTHON": sys.executable})
        ran: RunResult = await self.sandbox.run(
            ["bash", str(tests / "test.sh")],
            cwd=work,
            env=env,
            writable=[work, tests, verifier_logs, home],
            hide=hide,
            limits=Limits(timeout_s=harbor.verifier_timeout_s, memory_mb=self.memory_mb),
            logs=logs,
            log_name="tests",
            gateway_url=None,
        )
        return score(verifier_logs, ran.exit_code, ran.timed_out, self.reward_mode)
