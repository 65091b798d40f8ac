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
from reinforge.harnesses import ClaudeCode, HarnessAgent
from reinforge.harnesses.claude_code import INSTALL_DIR
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall
from reinforge.runner import Runner
from reinforge.types import RolloutSpec, SpanQuery, SpanStatusCode

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack, serve
from .three_tasks import (
    ScriptedHarnessModel,
    as_replies,
    assert_air_charged_to_the_asking_call,
    run_three_tasks,
    tool,
)

pytestmark = pytest.mark.skipif(
    not (INSTALL_DIR / "bin" / "claude").exists() or not Path("/usr/bin/node").exists(),
    reason="Claude Code is not installed (scripts/install_claude_code.sh)",
)


class ClaudeCodeModel(ScriptedHarnessModel):
    """Answers in Claude Code's tools (absolute paths, as its Read/Edit/Write want; Edit only after a
    Read, as it insists); its system prompt names the working directory."""

    def working_directory(self, messages: list[dict[str, Any]]) -> str:
        cwd = re.search(r"Primary working directory: (\S+)", str(messages[0]["content"]))
        assert cwd is not None, "Claude Code's system prompt names its working directory"
        return cwd.group(1)

    def script(self, task: str, cwd: str) -> list[ScriptedReply]:
        steps: dict[str, list[ScriptedToolCall | str]] = {
            "write-file": [
                tool("Bash", command="ls -la", description="List the files"),
                tool("Bash", command=f"cat {self.run_dir}/store.token", description="Read the store token"),
                tool("Write", file_path=f"{cwd}/hello.txt", content="Hello, reinforge!\n"),
                tool("Bash", command="cat hello.txt", description="Show the file"),
                "Created hello.txt with the requested line.",
            ],
            "fix-failing-test": [
                tool(
                    "Bash", command="python -m pytest -q -p no:cacheprovider test_calc.py", description="Run"
                ),
                tool("Read", file_path=f"{cwd}/calc.py"),
                tool(
                    "Edit", file_path=f"{cwd}/calc.py", old_string="return a - b", new_string="return a + b"
                ),
                tool(
                    "Bash",
                    command="python -m pytest -q -p no:cacheprovider test_calc.py",
                    description="Rerun",
                ),
                "Fixed add() in calc.py; the test passes.",
            ],
            "add-cli-flag": [
                tool("Read", file_path=f"{cwd}/greet.py"),
                tool(
                    "Edit",
                    file_path=f"{cwd}/greet.py",
                    old_string='    parser.add_argument("--name", default="world")\n',
                    new_string='    parser.add_argument("--name", default="world")\n'
                    '    parser.add_argument("--shout", action="store_true", help="print in upper case")\n',
                ),
                tool(
                    "Edit",
                    file_path=f"{cwd}/greet.py",
                    old_string="    print(message)",
                    new_string="    print(message.upper() if args.shout else message)",
                ),
                tool("Bash", command="python greet.py --name Ada --shout", description="Try the flag"),
                "Added --shout to greet.py.",
            ],
        }
        return as_replies(steps[task])


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
    run = await run_three_tasks(
        gateway,
        ClaudeCode(max_turns=10),
        model,
        tmp_path,
        endpoint="anthropic.messages",
        route="/v1/messages",
    )
    for outcome in run.outcomes:
        for call in outcome.calls:
            body = call.attributes[semconv.ATTR_LLM_REQUEST]
            assert body["stream"] is True and body["thinking"] == {"type": "adaptive"}
            assert {"Bash", "Read", "Edit", "Write"} <= {t["name"] for t in body["tools"]}
        # Its history only grows (compaction is off) and an Edit sent back with its schema's default
        # `replace_all: false` added is still the call the model made: every call merges into one sample.
        transitions, metrics = build_transitions(outcome.rollout, outcome.spans, CreditConfig(mode="merged"))
        assert len(transitions) == 1 and transitions[0].num_calls == len(outcome.calls), metrics
        assert metrics.merge_mismatches == 0 and transitions[0].final_reward == 1.0
        # A command that failed (the confined read of the store token; the test run before the fix)
        # comes back with is_error: one AIR tool_error, charged to the call that asked for it.
        assert outcome.failed_tools == (
            ["Bash"] if outcome.name in ("write-file", "fix-failing-test") else []
        )
        assert_air_charged_to_the_asking_call(outcome)
        if outcome.name == "write-file":
            denied = outcome.calls[2].attributes[semconv.ATTR_LLM_REQUEST]["messages"][-1]["content"][0]
            assert denied["is_error"] is True and "No such file or directory" in denied["content"]
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
