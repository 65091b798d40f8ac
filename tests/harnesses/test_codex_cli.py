"""Codex CLI, unchanged, completes shipped tasks through the real gateway's Responses API: a scripted
backend answers as a capable model would, in Codex's own tools (`exec_command`, a function tool, and
`apply_patch`, a custom freeform tool whose call comes back as a `custom_tool_call`), the runner runs
each attempt in its sandbox, and the task's tests give the reward. Commands that fail are read from
Codex's own rollout file and become AIR signals."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge import semconv
from reinforge.harnesses import CodexCli
from reinforge.harnesses.codex_cli import INSTALL_DIR
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall

from .conftest import GatewayStack, serve
from .three_tasks import (
    ScriptedHarnessModel,
    as_replies,
    assert_air_charged_to_the_asking_call,
    run_three_tasks,
    tool,
)

pytestmark = pytest.mark.skipif(
    not (INSTALL_DIR / "bin" / "codex").exists() or shutil.which("node") is None,
    reason="Codex CLI is not installed (scripts/install_codex_opencode.sh)",
)

FAILED = {"write-file": ["exec_command"], "fix-failing-test": ["exec_command"], "add-cli-flag": []}


def _exec(cmd: str) -> ScriptedToolCall:
    return tool("exec_command", cmd=cmd)


def _patch(body: str) -> ScriptedToolCall:
    return tool("apply_patch", input=f"*** Begin Patch\n{body}*** End Patch\n")


class CodexModel(ScriptedHarnessModel):
    """Answers in Codex's tools (relative paths: it runs them in its working directory)."""

    def working_directory(self, messages: list[dict[str, Any]]) -> str:
        users = "\n".join(str(m["content"]) for m in messages if m["role"] == "user")
        cwd = re.search(r"<cwd>(\S+)</cwd>", users)
        assert cwd is not None, "Codex names its working directory"
        return cwd.group(1)

    def script(self, task: str, cwd: str) -> list[ScriptedReply]:
        steps: dict[str, list[ScriptedToolCall | str]] = {
            "write-file": [
                _exec("ls -la"),
                _exec(f"cat {self.run_dir}/store.token"),
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
        return as_replies(steps[task])


@pytest.fixture
def model() -> CodexModel:
    return CodexModel()


@pytest.fixture
def gateway(harness_tokenizer: Any, model: CodexModel) -> Iterator[GatewayStack]:
    yield from serve(harness_tokenizer, model)


async def test_codex_solves_three_tasks_through_the_gateway(
    gateway: GatewayStack, model: CodexModel, tmp_path: Path
) -> None:
    run = await run_three_tasks(
        gateway, CodexCli(), model, tmp_path, endpoint="responses", route="/v1/responses"
    )
    for outcome in run.outcomes:
        for call in outcome.calls:
            body = call.attributes[semconv.ATTR_LLM_REQUEST]
            assert body["stream"] is True and body["store"] is False
            tools = {t["name"]: t["type"] for t in body["tools"]}
            assert tools["exec_command"] == "function" and tools["apply_patch"] == "custom"
        # The patch went back to Codex as a custom_tool_call and returns in the next request so.
        sent = [item for c in outcome.calls for item in c.attributes[semconv.ATTR_LLM_REQUEST]["input"]]
        kinds = {item.get("type") for item in sent}
        assert {"custom_tool_call", "custom_tool_call_output", "function_call_output"} <= kinds
        # The failed commands (the confined read of the store token; the test run before the fix),
        # read from Codex's rollout file: one AIR tool_error each.
        assert outcome.failed_tools == FAILED[outcome.name]
        assert_air_charged_to_the_asking_call(outcome)
