"""Claude Code, unchanged, completes shipped tasks through the real gateway: a scripted backend answers
as a capable model would, in Claude Code's own tool format (tool_use blocks for its Bash, Read, Edit
and Write tools), the runner runs each attempt in its sandbox, and the task's tests give the reward.
A second test gives it a context too short for its system prompt: the API's own error, a span that
says so, and an attempt that still ends scored."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.harnesses import ClaudeCode, HarnessAgent, load_task
from reinforge.harnesses.claude_code import INSTALL_DIR
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall
from reinforge.runner import Runner
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery, SpanStatusCode

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack, serve

pytestmark = pytest.mark.skipif(
    not (INSTALL_DIR / "bin" / "claude").exists() or not Path("/usr/bin/node").exists(),
    reason="Claude Code is not installed (scripts/install_claude_code.sh)",
)

SECRET_NAME = "store.token"


def _call(name: str, **arguments: Any) -> ScriptedToolCall:
    return ScriptedToolCall(name=name, arguments=arguments)


def _script(task: str, cwd: str, run_dir: str) -> list[ScriptedReply]:
    """What a capable model answers at each step of `task`, in Claude Code's tools (absolute paths,
    as its Read/Edit/Write want; Edit only after a Read, as it insists)."""
    steps: dict[str, list[ScriptedToolCall | str]] = {
        "write-file": [
            _call("Bash", command="ls -la", description="List the files"),
            # The sandbox hides the run folder: this read fails, and Claude Code reports is_error.
            _call("Bash", command=f"cat {run_dir}/{SECRET_NAME}", description="Read the store token"),
            _call("Write", file_path=f"{cwd}/hello.txt", content="Hello, reinforge!\n"),
            _call("Bash", command="cat hello.txt", description="Show the file"),
            "Created hello.txt with the requested line.",
        ],
        "fix-failing-test": [
            _call("Bash", command="python -m pytest -q -p no:cacheprovider test_calc.py", description="Run"),
            _call("Read", file_path=f"{cwd}/calc.py"),
            _call("Edit", file_path=f"{cwd}/calc.py", old_string="return a - b", new_string="return a + b"),
            _call(
                "Bash", command="python -m pytest -q -p no:cacheprovider test_calc.py", description="Rerun"
            ),
            "Fixed add() in calc.py; the test passes.",
        ],
        "add-cli-flag": [
            _call("Read", file_path=f"{cwd}/greet.py"),
            _call(
                "Edit",
                file_path=f"{cwd}/greet.py",
                old_string='    parser.add_argument("--name", default="world")\n',
                new_string='    parser.add_argument("--name", default="world")\n'
                '    parser.add_argument("--shout", action="store_true", help="print in upper case")\n',
            ),
            _call(
                "Edit",
                file_path=f"{cwd}/greet.py",
                old_string="    print(message)",
                new_string="    print(message.upper() if args.shout else message)",
            ),
            _call("Bash", command="python greet.py --name Ada --shout", description="Try the flag"),
            "Added --shout to greet.py.",
        ],
    }
    return [
        ScriptedReply(text=step)
        if isinstance(step, str)
        else ScriptedReply(text=f"Step {k + 1}.", tool_calls=[step])
        for k, step in enumerate(steps[task])
    ]


TASKS = ("write-file", "fix-failing-test", "add-cli-flag")
INSTRUCTIONS = {name: load_task(TASKS_ROOT / name).instruction.strip() for name in TASKS}
STEPS = {name: len(_script(name, "", "")) for name in TASKS}


class ClaudeCodeModel:
    """Finds the task in the first user turn, the working directory in Claude Code's system prompt,
    and the step from the assistant turns before; answers that step of the task's script."""

    def __init__(self) -> None:
        self.run_dir = ""

    def __call__(self, request: GenerationRequest) -> ScriptedReply:
        messages = request.messages or []
        system = str(messages[0]["content"])
        cwd = re.search(r"Primary working directory: (\S+)", system)
        assert cwd is not None, "Claude Code's system prompt names its working directory"
        first_user = next(str(m["content"]) for m in messages if m["role"] == "user")
        task = next(name for name, text in INSTRUCTIONS.items() if text in first_user)
        step = sum(1 for m in messages if m["role"] == "assistant")
        return _script(task, cwd.group(1), self.run_dir)[step]


@pytest.fixture(scope="module")
def model() -> ClaudeCodeModel:
    return ClaudeCodeModel()


@pytest.fixture
def gateway(harness_tokenizer: Any, model: ClaudeCodeModel) -> Iterator[GatewayStack]:
    yield from serve(harness_tokenizer, model)


def _agent(run_dir: Path, **kwargs: Any) -> HarnessAgent:
    return HarnessAgent(
        ClaudeCode(max_turns=10, **kwargs),
        attempts_dir=run_dir / "attempts",
        tasks_root=TASKS_ROOT,
        hide=[run_dir],
        timeout_s=120,
    )


async def test_claude_code_solves_three_tasks_through_the_gateway(
    gateway: GatewayStack, model: ClaudeCodeModel, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / SECRET_NAME).write_text("not for attempts")
    model.run_dir = str(run_dir)
    rollouts = await gateway.store.enqueue_rollouts(
        [RolloutSpec(task={"harbor_task": name}, max_attempts=1) for name in TASKS]
    )
    runner = Runner(gateway.store, _agent(run_dir), gateway.gateway_url, GATEWAY_SECRET, concurrency=3)
    stats = await runner.run(max_rollouts=3)

    results = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "attempts").glob("*/result.json")}
    assert (stats.succeeded, stats.failed) == (3, 0), results
    final = await gateway.store.wait_for_rollouts([r.rollout_id for r in rollouts], 30)
    for rollout in final:
        name = Path(rollout.task["harbor_task"]).name
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0, name
        spans = (await gateway.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        assert len(calls) == STEPS[name]  # every call recorded, the closing text included
        for call in calls:
            ids = call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
            assert ids and call.attributes[semconv.ATTR_PROMPT_TOKEN_IDS]
            assert len(call.attributes[semconv.ATTR_COMPLETION_LOGPROBS]) == len(ids)
            assert call.attributes[semconv.ATTR_LLM_ENDPOINT] == "anthropic.messages"
            body = call.attributes[semconv.ATTR_LLM_REQUEST]
            assert body["stream"] is True and body["thinking"] == {"type": "adaptive"}
            assert {"Bash", "Read", "Edit", "Write"} <= {t["name"] for t in body["tools"]}
        # Its history only grows (compaction is off) and an Edit sent back with its schema's default
        # `replace_all: false` added is still the call the model made: every call merges into one sample.
        transitions, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"))
        assert len(transitions) == 1 and transitions[0].num_calls == len(calls), metrics
        assert metrics.merge_mismatches == 0 and transitions[0].final_reward == 1.0
        # A command that failed (the confined read of the store token; the test run before the fix)
        # comes back with is_error: one AIR tool_error, charged to the call that asked for it.
        failed = [s for s in spans if s.name == semconv.SPAN_TOOL_RESULT]
        assert [s.attributes[semconv.ATTR_TOOL_NAME] for s in failed] == (
            ["Bash"] if name in ("write-file", "fix-failing-test") else []
        )
        for span in failed:
            assert span.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
        if name == "write-file":
            denied = calls[2].attributes[semconv.ATTR_LLM_REQUEST]["messages"][-1]["content"][0]
            assert denied["is_error"] is True and "No such file or directory" in denied["content"]
    for result in results.values():
        assert result["sandbox"] == "namespaces" and result["harness_exit_code"] == 0
        assert result["tests"]["source"] == "junit" and result["tests"]["reward"] == 1.0
    errors = [s for s in gateway.statuses.seen if s[2] >= 400]
    assert not errors, errors
    posts = [s for s in gateway.statuses.seen if s[0] == "POST" and s[1].endswith("/v1/messages")]
    assert len(posts) == sum(STEPS.values())
    assert any(s[0] == "HEAD" for s in gateway.statuses.seen)  # its warm-up, answered 200


async def test_a_context_too_short_ends_the_run_with_the_apis_error(
    harness_tokenizer: Any, model: ClaudeCodeModel, tmp_path: Path
) -> None:
    """The served model's context cannot hold Claude Code's prompt: its first call gets Anthropic's
    "prompt is too long: N tokens > M maximum" (mid-stream, as it streams), it stops with that, the
    span says so, and the attempt is still scored (0: nothing was written)."""
    run_dir = tmp_path / "run"
    for gateway in serve(harness_tokenizer, model, max_seq_len=2048):
        [rollout] = await gateway.store.enqueue_rollouts([RolloutSpec(task={"harbor_task": "write-file"})])
        runner = Runner(gateway.store, _agent(run_dir), gateway.gateway_url, GATEWAY_SECRET)
        await runner.run(max_rollouts=1)
        [final] = await gateway.store.wait_for_rollouts([rollout.rollout_id], 30)
        assert final.reward == 0.0
        spans = (await gateway.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        refused = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        assert refused and gateway.backend.requests
        for span in refused:
            assert span.status.code == SpanStatusCode.error
            assert span.attributes[semconv.ATTR_FINISH_REASON] == "context_length_exceeded"
            assert "2048" in (span.status.message or "")
        [out] = list((run_dir / "attempts").glob("*/logs/harness.out"))
        result = [json.loads(line) for line in out.read_text().splitlines() if '"type":"result"' in line]
        assert result and result[-1]["is_error"] is True
        assert "Prompt is too long" in result[-1]["result"], result[-1]
