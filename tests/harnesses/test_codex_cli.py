"""Codex CLI, unchanged, completes shipped tasks through the real gateway's Responses API: a scripted
backend answers as a capable model would, in Codex's own tools (`exec_command`, a function tool, and
`apply_patch`, a custom freeform tool whose call comes back as a `custom_tool_call`), the runner runs
each attempt in its sandbox, and the task's tests give the reward. Commands that fail are read from
Codex's own rollout file and become AIR signals."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge import semconv
from reinforge.harnesses import CodexCli, HarnessAgent, load_task
from reinforge.harnesses.codex_cli import INSTALL_DIR
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall
from reinforge.runner import Runner
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack, serve

pytestmark = pytest.mark.skipif(
    not (INSTALL_DIR / "bin" / "codex").exists() or shutil.which("node") is None,
    reason="Codex CLI is not installed (scripts/install_codex_opencode.sh)",
)

SECRET_NAME = "store.token"


def _exec(cmd: str) -> ScriptedToolCall:
    return ScriptedToolCall(name="exec_command", arguments={"cmd": cmd})


def _patch(body: str) -> ScriptedToolCall:
    return ScriptedToolCall(
        name="apply_patch", arguments={"input": f"*** Begin Patch\n{body}*** End Patch\n"}
    )


def _script(task: str, run_dir: str) -> list[ScriptedReply]:
    """What a capable model answers at each step of `task`, in Codex's tools."""
    steps: dict[str, list[ScriptedToolCall | str]] = {
        "write-file": [
            _exec("ls -la"),
            # The sandbox hides the run folder: this read fails (exit 1), an AIR signal.
            _exec(f"cat {run_dir}/{SECRET_NAME}"),
            _patch("*** Add File: hello.txt\n+Hello, reinforge!\n"),
            _exec("cat hello.txt"),
            "Created hello.txt with the requested line.",
        ],
        "fix-failing-test": [
            _exec("python -m pytest -q -p no:cacheprovider test_calc.py"),
            _exec("cat calc.py"),
            _patch("*** Update File: calc.py\n@@\n-    return a - b\n+    return a + b\n"),
            _exec("python -m pytest -q -p no:cacheprovider test_calc.py"),
            "Fixed add() in calc.py; the test passes.",
        ],
        "add-cli-flag": [
            _exec("cat greet.py"),
            _patch(
                "*** Update File: greet.py\n@@\n"
                '     parser.add_argument("--name", default="world")\n'
                '+    parser.add_argument("--shout", action="store_true", help="print in upper case")\n'
                "     args = parser.parse_args()\n"
                "@@\n"
                "-    print(message)\n"
                "+    print(message.upper() if args.shout else message)\n"
            ),
            _exec("python greet.py --name Ada --shout"),
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
STEPS = {name: len(_script(name, "")) for name in TASKS}
FAILED = {"write-file": ["exec_command"], "fix-failing-test": ["exec_command"], "add-cli-flag": []}


class CodexModel:
    """Finds the task in the user turns and the step from the assistant turns before; answers that
    step of the task's script."""

    def __init__(self) -> None:
        self.run_dir = ""

    def __call__(self, request: GenerationRequest) -> ScriptedReply:
        messages = request.messages or []
        users = "\n".join(str(m["content"]) for m in messages if m["role"] == "user")
        assert re.search(r"<cwd>\S+</cwd>", users), "Codex names its working directory"
        task = next(name for name, text in INSTRUCTIONS.items() if text in users)
        step = sum(1 for m in messages if m["role"] == "assistant")
        return _script(task, self.run_dir)[step]


@pytest.fixture
def model() -> CodexModel:
    return CodexModel()


@pytest.fixture
def gateway(harness_tokenizer: Any, model: CodexModel) -> Iterator[GatewayStack]:
    yield from serve(harness_tokenizer, model)


async def test_codex_solves_three_tasks_through_the_gateway(
    gateway: GatewayStack, model: CodexModel, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / SECRET_NAME).write_text("not for attempts")
    model.run_dir = str(run_dir)
    rollouts = await gateway.store.enqueue_rollouts(
        [RolloutSpec(task={"harbor_task": name}, max_attempts=1) for name in TASKS]
    )
    agent = HarnessAgent(
        CodexCli(), attempts_dir=run_dir / "attempts", tasks_root=TASKS_ROOT, hide=[run_dir], timeout_s=120
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
            assert call.attributes[semconv.ATTR_LLM_ENDPOINT] == "responses"
            body = call.attributes[semconv.ATTR_LLM_REQUEST]
            assert body["stream"] is True and body["store"] is False
            tools = {t["name"]: t["type"] for t in body["tools"]}
            assert tools["exec_command"] == "function" and tools["apply_patch"] == "custom"
        # The patch went back to Codex as a custom_tool_call and returns in the next request so.
        sent = [item for c in calls for item in c.attributes[semconv.ATTR_LLM_REQUEST]["input"]]
        kinds = {item.get("type") for item in sent}
        assert {"custom_tool_call", "custom_tool_call_output", "function_call_output"} <= kinds
        # The failed commands (the confined read of the store token; the test run before the fix),
        # read from Codex's rollout file: one AIR tool_error each.
        failed = [s for s in spans if s.name == semconv.SPAN_TOOL_RESULT]
        assert [s.attributes[semconv.ATTR_TOOL_NAME] for s in failed] == FAILED[name]
        for span in failed:
            assert span.attributes[semconv.ATTR_AIR_SIGNAL] == semconv.AIR_TOOL_ERROR
            asked = [c for c in calls if c.start_time <= span.start_time][-1]
            assert asked is calls[1 if name == "write-file" else 0]  # charged to the call that asked
    for result in results.values():
        assert result["sandbox"] == "namespaces" and result["harness_exit_code"] == 0
        assert result["tests"]["source"] == "junit" and result["tests"]["reward"] == 1.0
    errors = [s for s in gateway.statuses.seen if s[2] >= 400]
    assert not errors, errors
    posts = [s for s in gateway.statuses.seen if s[0] == "POST" and s[1].endswith("/v1/responses")]
    assert len(posts) == sum(STEPS.values())
