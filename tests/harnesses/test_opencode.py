"""OpenCode, unchanged, completes shipped tasks through the real gateway's chat completions: a scripted
backend answers as a capable model would, in OpenCode's own tools (bash, read, edit, write), the runner
runs each attempt in its sandbox, and the task's tests give the reward. Tool calls that failed are read
from OpenCode's own sqlite db and become AIR signals."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge import semconv
from reinforge.harnesses import HarnessAgent, OpenCode, load_task
from reinforge.harnesses.opencode import INSTALL_DIR
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall
from reinforge.runner import Runner
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack, serve

pytestmark = pytest.mark.skipif(
    not (INSTALL_DIR / "bin" / "opencode").exists() or shutil.which("node") is None,
    reason="OpenCode is not installed (scripts/install_codex_opencode.sh)",
)

SECRET_NAME = "store.token"


def _call(name: str, **arguments: Any) -> ScriptedToolCall:
    return ScriptedToolCall(name=name, arguments=arguments)


def _script(task: str, cwd: str, run_dir: str) -> list[ScriptedReply]:
    """What a capable model answers at each step of `task`, in OpenCode's tools."""
    steps: dict[str, list[ScriptedToolCall | str]] = {
        "write-file": [
            _call("bash", command="ls -la", description="List the files"),
            # The sandbox hides the run folder: this read fails (exit 1), an AIR signal.
            _call("bash", command=f"cat {run_dir}/{SECRET_NAME}", description="Read the store token"),
            _call("write", filePath=f"{cwd}/hello.txt", content="Hello, reinforge!\n"),
            _call("bash", command="cat hello.txt", description="Show the file"),
            "Created hello.txt with the requested line.",
        ],
        "fix-failing-test": [
            _call("bash", command="python -m pytest -q -p no:cacheprovider test_calc.py", description="Run"),
            _call("read", filePath=f"{cwd}/calc.py"),
            _call("edit", filePath=f"{cwd}/calc.py", oldString="return a - b", newString="return a + b"),
            _call(
                "bash", command="python -m pytest -q -p no:cacheprovider test_calc.py", description="Rerun"
            ),
            "Fixed add() in calc.py; the test passes.",
        ],
        "add-cli-flag": [
            _call("read", filePath=f"{cwd}/greet.py"),
            _call(
                "edit",
                filePath=f"{cwd}/greet.py",
                oldString='    parser.add_argument("--name", default="world")\n',
                newString='    parser.add_argument("--name", default="world")\n'
                '    parser.add_argument("--shout", action="store_true", help="print in upper case")\n',
            ),
            _call(
                "edit",
                filePath=f"{cwd}/greet.py",
                oldString="    print(message)",
                newString="    print(message.upper() if args.shout else message)",
            ),
            _call("bash", command="python greet.py --name Ada --shout", description="Try the flag"),
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
FAILED = {"write-file": ["bash"], "fix-failing-test": ["bash"], "add-cli-flag": []}


class OpenCodeModel:
    """Finds the task in the first user turn, the working directory in OpenCode's system prompt, and
    the step from the assistant turns before; answers that step of the task's script."""

    def __init__(self) -> None:
        self.run_dir = ""

    def __call__(self, request: GenerationRequest) -> ScriptedReply:
        messages = request.messages or []
        system = "\n".join(str(m["content"]) for m in messages if m["role"] == "system")
        cwd = re.search(r"Working directory: (\S+)", system)
        assert cwd is not None, "OpenCode's system prompt names its working directory"
        users = "\n".join(str(m["content"]) for m in messages if m["role"] == "user")
        task = next(name for name, text in INSTRUCTIONS.items() if text in users)
        step = sum(1 for m in messages if m["role"] == "assistant")
        return _script(task, cwd.group(1), self.run_dir)[step]


@pytest.fixture
def model() -> OpenCodeModel:
    return OpenCodeModel()


@pytest.fixture
def gateway(harness_tokenizer: Any, model: OpenCodeModel) -> Iterator[GatewayStack]:
    yield from serve(harness_tokenizer, model)


async def test_opencode_solves_three_tasks_through_the_gateway(
    gateway: GatewayStack, model: OpenCodeModel, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / SECRET_NAME).write_text("not for attempts")
    model.run_dir = str(run_dir)
    rollouts = await gateway.store.enqueue_rollouts(
        [RolloutSpec(task={"harbor_task": name}, max_attempts=1) for name in TASKS]
    )
    agent = HarnessAgent(
        OpenCode(), attempts_dir=run_dir / "attempts", tasks_root=TASKS_ROOT, hide=[run_dir], timeout_s=120
    )
    stats = await Runner(gateway.store, agent, gateway.gateway_url, GATEWAY_SECRET, concurrency=3).run(
        max_rollouts=3
    )

    results = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "attempts").glob("*/result.json")}
    assert (stats.succeeded, stats.failed) == (3, 0), results
    final = await gateway.store.wait_for_rollouts([r.rollout_id for r in rollouts], 30)
    for rollout in final:
        name = Path(rollout.task["harbor_task"]).name
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0, name
        spans = (await gateway.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        calls = sorted(
            (s for s in spans if s.name == semconv.SPAN_LLM_CALL),
            key=lambda s: s.attributes[semconv.ATTR_SEQUENCE_IN_ATTEMPT],
        )
        assert len(calls) == STEPS[name]  # every call recorded, the closing text included
        for call in calls:
            ids = call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
            assert ids and call.attributes[semconv.ATTR_PROMPT_TOKEN_IDS]
            assert len(call.attributes[semconv.ATTR_COMPLETION_LOGPROBS]) == len(ids)
            assert call.attributes[semconv.ATTR_LLM_ENDPOINT] == "chat.completions"
            body = call.attributes[semconv.ATTR_LLM_REQUEST]
            assert body["stream"] is True
            assert {"bash", "read", "edit", "write"} <= {t["function"]["name"] for t in body["tools"]}
        # The failed commands, read from OpenCode's db: one AIR tool_error each, charged to the call
        # that asked for the tool.
        failed = [s for s in spans if s.name == semconv.SPAN_TOOL_RESULT]
        assert [s.attributes[semconv.ATTR_TOOL_NAME] for s in failed] == FAILED[name]
        for span in failed:
            assert span.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
            asked = [c for c in calls if c.start_time <= span.start_time][-1]
            assert asked is calls[1 if name == "write-file" else 0]
    for result in results.values():
        assert result["sandbox"] == "namespaces" and result["harness_exit_code"] == 0
        assert result["tests"]["source"] == "junit" and result["tests"]["reward"] == 1.0
    errors = [s for s in gateway.statuses.seen if s[2] >= 400]
    assert not errors, errors
    posts = [s for s in gateway.statuses.seen if s[0] == "POST" and s[1].endswith("/v1/chat/completions")]
    assert len(posts) == sum(STEPS.values())
