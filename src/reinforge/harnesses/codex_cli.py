"""Codex CLI (npm `@openai/codex`, `scripts/install_codex_opencode.sh`) as a harness.

Started as its own `codex exec <instruction>` command, unchanged, with a custom model provider in
the attempt's own `CODEX_HOME/config.toml`: `base_url` = the gateway's `/v1`, `wire_api = "responses"`
(Codex speaks only the Responses API, streamed), `env_key` naming the variable with the attempt's key.
A one-entry model catalog (`model_catalog_json`) describes the served model the way Codex's own
catalog describes its models, so it gets Codex's standard tools: `exec_command` (a function tool)
and `apply_patch` as a *custom* (freeform) tool. Without it Codex falls back to metadata with no
patch tool. Web search (no network), sub-agents and goals are switched off; Codex's own sandbox
too (`danger-full-access`): the attempt's sandbox confines it, and Codex's would need namespaces
of its own inside ours. Approvals are `never`: nobody is there to grant one.

What it sends (version 0.171.0, from requests it made to the gateway): `POST /v1/responses` with
`stream`, `store: false`, `include: ["reasoning.encrypted_content"]`, `reasoning: {"summary": ...}`,
`prompt_cache_key`, `client_metadata`, `parallel_tool_calls`, its tools and the whole history as
`input` items (developer and user messages, `function_call`/`custom_tool_call` and their outputs).

Its rollout (`CODEX_HOME/sessions/**/rollout-*.jsonl`) records every tool call and its output;
`tool_failures` reads commands that exited non-zero and patches that did not apply from it.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from reinforge.errors import InvalidRequestError
from reinforge.harnesses.harness import HarnessContext, ToolFailure

VERSION = "0.171.0"
"""The version `scripts/install_codex_opencode.sh` installs and the tests run."""

INSTALL_DIR = Path(__file__).resolve().parents[3] / ".harness-bin"
"""Where the set-up script installs it: `.harness-bin/` in the checkout."""

KEY_VARIABLE = "REINFORGE_API_KEY"
"""The variable the provider's `env_key` names: Codex sends its value as the bearer token."""

INSTRUCTIONS = (
    "You are Codex, a coding agent. You work in the user's repository through your tools: "
    "run commands with exec_command and edit files with apply_patch. Finish the task, check it, "
    "then say briefly what you did."
)
"""The model's base instructions (the catalog's `base_instructions`)."""

_EXIT = re.compile(r"(?:Process exited with code|Exit code:?)\s*(-?\d+)")


def find_codex() -> str:
    """The `codex` command installed by the set-up script, else on PATH."""
    installed = INSTALL_DIR / "bin" / "codex"
    found = str(installed) if installed.exists() else shutil.which("codex")
    if found is None:
        raise InvalidRequestError(
            "Codex CLI is not installed: run scripts/install_codex_opencode.sh "
            f"(npm install @openai/codex@{VERSION}), or pass CodexCli(executable=...)"
        )
    return found


def model_entry(model: str, context_window: int) -> dict[str, Any]:
    """The served model as an entry of Codex's model catalog (the fields its own entries have that
    pick its tools: a freeform apply_patch, the `exec_command` shell; no reasoning, no verbosity)."""
    return {
        "slug": model,
        "display_name": model,
        "description": "the policy served by the reinforge gateway",
        "base_instructions": INSTRUCTIONS,
        "apply_patch_tool_type": "freeform",
        "shell_type": "shell_command",
        "supports_parallel_tool_calls": True,
        "context_window": context_window,
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "input_modalities": ["text"],
        "visibility": "list",
        "supported_in_api": True,
        "priority": 1,
        "default_reasoning_level": None,
        "supported_reasoning_levels": [],
        "supports_reasoning_summaries": False,
        "support_verbosity": False,
        "experimental_supported_tools": [],
    }


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


@dataclass(frozen=True)
class CodexCli:
    """`context_window` is what Codex is told the model holds (it compacts its history near it)."""

    context_window: int = 32768
    executable: str | None = None
    name: str = "codex"
    address_space_mb: int | None = 16384
    """Its Node launcher and native binary run under the same floor as Claude Code's (the least
    address space Codex needs under the 4 GB default cap was not measured)."""

    def home(self, ctx: HarnessContext) -> Path:
        return ctx.state_dir / "codex"

    def write_config(self, ctx: HarnessContext) -> Path:
        """`CODEX_HOME` with the gateway as its only model provider and the served model's catalog."""
        home = self.home(ctx)
        home.mkdir(parents=True, exist_ok=True)
        catalog = home / "model_catalog.json"
        catalog.write_text(json.dumps({"models": [model_entry(ctx.model, self.context_window)]}))
        (home / "config.toml").write_text(
            "\n".join(
                [
                    f"model = {_toml(ctx.model)}",
                    'model_provider = "reinforge"',
                    f"model_catalog_json = {_toml(str(catalog))}",
                    'approval_policy = "never"',
                    'sandbox_mode = "danger-full-access"',
                    'web_search = "disabled"',
                    "allow_login_shell = false",  # a login shell's profile resets PATH
                    "check_for_update_on_startup = false",
                    "[features]",
                    "multi_agent = false",
                    "goals = false",
                    "[analytics]",
                    "enabled = false",
                    "[model_providers.reinforge]",
                    'name = "reinforge"',
                    f"base_url = {_toml(ctx.base_url)}",
                    f"env_key = {_toml(KEY_VARIABLE)}",
                    'wire_api = "responses"',
                    "request_max_retries = 1",
                    "stream_max_retries = 1",
                    "",
                ]
            )
        )
        return home

    def command(self, ctx: HarnessContext) -> list[str]:
        self.write_config(ctx)
        return [
            self.executable or find_codex(),
            "exec",
            "--skip-git-repo-check",
            "--sandbox", "danger-full-access",
            "--json",
            "--cd", str(ctx.workdir),
            "--model", ctx.model,
            ctx.instruction,
        ]  # fmt: skip

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {"CODEX_HOME": str(self.home(ctx)), KEY_VARIABLE: ctx.api_key, "NO_COLOR": "1"}

    def tool_failures(self, state_dir: Path) -> list[ToolFailure]:
        """Tool calls whose output its rollout records as failed (see `rollout_failures`)."""
        failures: list[ToolFailure] = []
        for path in sorted((state_dir / "codex" / "sessions").rglob("rollout-*.jsonl")):
            failures += rollout_failures(path)
        return failures


def _records(path: Path) -> Iterator[dict[str, Any]]:
    for line in path.read_text(errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            yield record


def _time(record: dict[str, Any]) -> float:
    stamp = record.get("timestamp")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
        except ValueError:
            pass
    return 0.0


def rollout_failures(path: Path) -> list[ToolFailure]:
    """From one Codex rollout: each `function_call_output` whose command exited non-zero (Codex
    writes "Process exited with code N" in it) and each `custom_tool_call_output` of a patch that
    did not apply, named by the call it answers."""
    names: dict[str, str] = {}
    failures: list[ToolFailure] = []
    for record in _records(path):
        payload = record.get("payload")
        if record.get("type") != "response_item" or not isinstance(payload, dict):
            continue
        kind, call_id = payload.get("type"), str(payload.get("call_id") or "")
        if kind in ("function_call", "custom_tool_call"):
            names[call_id] = str(payload.get("name") or "")
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = _output_text(payload.get("output"))
            if _failed(kind, output):
                failures.append(
                    ToolFailure(names.get(call_id, "unknown"), call_id, _time(record), output[:500])
                )
    return failures


def _output_text(output: Any) -> str:
    if isinstance(output, str):
        return output
    if isinstance(output, dict):
        return _output_text(output.get("content") or output.get("output") or "")
    if isinstance(output, list):
        return "".join(str(p.get("text", "")) for p in output if isinstance(p, dict))
    return ""


def _failed(kind: str, output: str) -> bool:
    try:  # a JSON output ({"output": ..., "metadata": {"exit_code": N}}) says it directly
        parsed = json.loads(output)
        code = parsed.get("metadata", {}).get("exit_code") if isinstance(parsed, dict) else None
        if isinstance(code, int):
            return code != 0
    except ValueError:
        pass
    match = _EXIT.search(output)
    if match is not None:
        return int(match.group(1)) != 0
    if kind == "custom_tool_call_output":
        lowered = output.lower()
        return "failed" in lowered or "error" in lowered or "verification" in lowered
    return False
