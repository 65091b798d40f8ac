"""What the Claude Code, Codex and OpenCode tests share: the three shipped tasks, a scripted model that
answers each step of a task's script in the harness's own tools, and one run of the three tasks through
the real runner, store and gateway with the checks every harness must pass."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge import semconv
from reinforge.harnesses import Harness, HarnessAgent, load_task
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall
from reinforge.runner import Runner
from reinforge.runner.runner import RunnerStats
from reinforge.types import Rollout, RolloutSpec, RolloutStatus, Span, SpanQuery

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack

TASKS = ("write-file", "fix-failing-test", "add-cli-flag")
INSTRUCTIONS = {name: load_task(TASKS_ROOT / name).instruction.strip() for name in TASKS}
SECRET_NAME = "store.token"
"""A file in the run folder that the sandbox hides: reading it fails, an AIR signal."""


def tool(name: str, **arguments: Any) -> ScriptedToolCall:
    return ScriptedToolCall(name=name, arguments=arguments)


def as_replies(steps: Sequence[ScriptedToolCall | str]) -> list[ScriptedReply]:
    """A tool call per step, each with a short text; a plain string is the closing answer."""
    return [
        ScriptedReply(text=step)
        if isinstance(step, str)
        else ScriptedReply(text=f"Step {k + 1}.", tool_calls=[step])
        for k, step in enumerate(steps)
    ]


class ScriptedHarnessModel(ABC):
    """Finds the task and the working directory in the harness's own prompt, and the step from the
    assistant turns before; answers that step of the task's script."""

    def __init__(self) -> None:
        self.run_dir = ""

    @abstractmethod
    def script(self, task: str, cwd: str) -> list[ScriptedReply]:
        """What a capable model answers at each step of `task`, in the harness's tools."""

    @abstractmethod
    def working_directory(self, messages: list[dict[str, Any]]) -> str:
        """Where the harness says it works (asserting that it says so)."""

    def steps(self, task: str) -> int:
        return len(self.script(task, ""))

    def __call__(self, request: GenerationRequest) -> ScriptedReply:
        messages = request.messages or []
        cwd = self.working_directory(messages)
        users = "\n".join(str(m["content"]) for m in messages if m["role"] == "user")
        task = next(name for name, text in INSTRUCTIONS.items() if text in users)
        step = sum(1 for m in messages if m["role"] == "assistant")
        return self.script(task, cwd)[step]


@dataclass
class TaskOutcome:
    name: str
    rollout: Rollout
    spans: list[Span]
    calls: list[Span]
    """Its LLM calls, in the order the attempt made them."""

    @property
    def failed_tools(self) -> list[str]:
        return [
            s.attributes[semconv.ATTR_TOOL_NAME] for s in self.spans if s.name == semconv.SPAN_TOOL_RESULT
        ]


@dataclass
class ThreeTaskRun:
    stats: RunnerStats
    outcomes: list[TaskOutcome]


async def run_three_tasks(
    gateway: GatewayStack,
    harness: Harness,
    model: ScriptedHarnessModel,
    tmp_path: Path,
    *,
    endpoint: str,
    route: str,
) -> ThreeTaskRun:
    """Runs the three tasks once each, three at a time, and checks what every harness must do: all
    three solved (reward 1.0 from the tests, in the sandbox), every call recorded with its token ids
    and logprobs at `endpoint`, and the gateway never answering an error (`route`: its POST path)."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / SECRET_NAME).write_text("not for attempts")
    model.run_dir = str(run_dir)
    rollouts = await gateway.store.enqueue_rollouts(
        [RolloutSpec(task={"harbor_task": name}, max_attempts=1) for name in TASKS]
    )
    agent = HarnessAgent(
        harness, attempts_dir=run_dir / "attempts", tasks_root=TASKS_ROOT, hide=[run_dir], timeout_s=120
    )
    runner = Runner(gateway.store, agent, gateway.gateway_url, GATEWAY_SECRET, concurrency=3)
    stats = await runner.run(max_rollouts=3)

    results = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "attempts").glob("*/result.json")}
    assert (stats.succeeded, stats.failed) == (3, 0), results
    outcomes = []
    for rollout in await gateway.store.wait_for_rollouts([r.rollout_id for r in rollouts], 30):
        name = Path(rollout.task["harbor_task"]).name
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0, name
        spans = (await gateway.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        calls = sorted(
            (s for s in spans if s.name == semconv.SPAN_LLM_CALL),
            key=lambda s: s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT],
        )
        assert len(calls) == model.steps(name)  # every call recorded, the closing text included
        for call in calls:
            ids = call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
            assert ids and call.attributes[semconv.ATTR_PROMPT_TOKEN_IDS]
            assert len(call.attributes[semconv.ATTR_COMPLETION_LOGPROBS]) == len(ids)
            assert call.attributes[semconv.ATTR_LLM_ENDPOINT] == endpoint
        outcomes.append(TaskOutcome(name=name, rollout=rollout, spans=spans, calls=calls))
    for result in results.values():
        assert result["sandbox"] == "namespaces" and result["harness_exit_code"] == 0
        assert result["tests"]["source"] == "junit" and result["tests"]["reward"] == 1.0
    errors = [s for s in gateway.statuses.seen if s[2] >= 400]
    assert not errors, errors
    posts = [s for s in gateway.statuses.seen if s[0] == "POST" and s[1].endswith(route)]
    assert len(posts) == sum(model.steps(name) for name in TASKS)
    return ThreeTaskRun(stats=stats, outcomes=outcomes)


def assert_air_charged_to_the_asking_call(outcome: TaskOutcome) -> None:
    """Each failed tool is one AIR tool_error span, charged to the call that asked for the tool (the
    confined read of the store token is the second call of write-file; the first test run the first
    call of fix-failing-test)."""
    for span in (s for s in outcome.spans if s.name == semconv.SPAN_TOOL_RESULT):
        assert span.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
        asked = [c for c in outcome.calls if c.start_time <= span.start_time][-1]
        assert asked is outcome.calls[1 if outcome.name == "write-file" else 0]
