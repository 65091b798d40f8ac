"""OpenCode, unchanged, completes shipped tasks through the real gateway's chat completions: a scripted
backend answers as a capable model would, in OpenCode's own tools (bash, read, edit, write), the runner
runs each attempt in its sandbox, and the task's tests give the reward. Tool calls that failed are read
from OpenCode's own sqlite db and become AIR signals."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge import semconv
from reinforge.harnesses import OpenCode
from reinforge.harnesses.opencode import INSTALL_DIR
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
    not (INSTALL_DIR / "bin" / "opencode").exists() or shutil.which("node") is None,
    reason="OpenCode is not installed (scripts/install_codex_opencode.sh)",
)

FAILED = {"write-file": ["bash"], "fix-failing-test": ["bash"], "add-cli-flag": []}


class OpenCodeModel(ScriptedHarnessModel):
    """Answers in OpenCode's tools; its system prompt names the working directory."""

    def working_directory(self, messages: list[dict[str, Any]]) -> str:
        system = "\n".join(str(m["content"]) for m in messages if m["role"] == "system")
        cwd = re.search(r"Working directory: (\S+)", system)
        assert cwd is not None, "OpenCode's system prompt names its working directory"
        return cwd.group(1)

    def script(self, task: str, cwd: str) -> list[ScriptedReply]:
        run_dir = self.run_dir
        steps: dict[str, list[ScriptedToolCall | str]] = {
            "write-file": [
                tool("bash", command="ls -la", description="List the files"),
                tool("bash", command=f"cat {run_dir}/store.token", description="Read the store token"),
                tool("write", filePath=f"{cwd}/hello.txt", content="Hello, reinforge!\n"),
                tool("bash", command="cat hello.txt", description="Show the file"),
                "Created hello.txt with the requested line.",
            ],
            "fix-failing-test": [
                tool(
                    "bash", command="python -m pytest -q -p no:cacheprovider test_calc.py", description="Run"
                ),
                tool("read", filePath=f"{cwd}/calc.py"),
                tool("edit", filePath=f"{cwd}/calc.py", oldString="return a - b", newString="return a + b"),
                tool(
                    "bash",
                    command="python -m pytest -q -p no:cacheprovider test_calc.py",
                    description="Rerun",
                ),
                "Fixed add() in calc.py; the test passes.",
            ],
            "add-cli-flag": [
                tool("read", filePath=f"{cwd}/greet.py"),
                tool(
                    "edit",
                    filePath=f"{cwd}/greet.py",
                    oldString='    parser.add_argument("--name", default="world")\n',
                    newString='    parser.add_argument("--name", default="world")\n'
                    '    parser.add_argument("--shout", action="store_true", help="print in upper case")\n',
                ),
                tool(
                    "edit",
                    filePath=f"{cwd}/greet.py",
                    oldString="    print(message)",
                    newString="    print(message.upper() if args.shout else message)",
                ),
                tool("bash", command="python greet.py --name Ada --shout", description="Try the flag"),
                "Added --shout to greet.py.",
            ],
        }
        return as_replies(steps[task])


@pytest.fixture
def model() -> OpenCodeModel:
    return OpenCodeModel()


@pytest.fixture
def gateway(harness_tokenizer: Any, model: OpenCodeModel) -> Iterator[GatewayStack]:
    yield from serve(harness_tokenizer, model)


async def test_opencode_solves_three_tasks_through_the_gateway(
    gateway: GatewayStack, model: OpenCodeModel, tmp_path: Path
) -> None:
    run = await run_three_tasks(
        gateway, OpenCode(), model, tmp_path, endpoint="chat.completions", route="/v1/chat/completions"
    )
    for outcome in run.outcomes:
        for call in outcome.calls:
            body = call.attributes[semconv.ATTR_LLM_REQUEST]
            assert body["stream"] is True
            assert {"bash", "read", "edit", "write"} <= {t["function"]["name"] for t in body["tools"]}
        # The failed commands, read from OpenCode's db: one AIR tool_error each.
        assert outcome.failed_tools == FAILED[outcome.name]
        assert_air_charged_to_the_asking_call(outcome)
