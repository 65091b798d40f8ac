"""OpenCode (npm `opencode-ai`, `scripts/install_codex_opencode.sh`) as a harness.

Started as its own `opencode run <instruction>` command, unchanged, with an OpenAI-compatible
provider (`@ai-sdk/openai-compatible`, bundled with it) in the attempt's own `opencode.json`
(`OPENCODE_CONFIG`): `baseURL` = the gateway's `/v1`, `apiKey` = the attempt's key. Every call is a
streamed chat completion. Its config, data (the sqlite db of sessions, messages and tool parts),
cache and state live under the attempt's home (`XDG_*_HOME`). Titles are not generated (that is a
side call on another prompt), sub-agents (`task`), skills and web fetches are off, and its edit and
bash tools are allowed unasked (nobody is there to grant a permission).

OpenCode runs on Bun, which reserves a large address space up front: it needs a higher `RLIMIT_AS`
floor than the agent's cap (`address_space_mb`). Its tool parts in `opencode.db` record each call's
status, and the bash tool its exit code: `tool_failures` reads the failed ones.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.errors import InvalidRequestError
from reinforge.harnesses.harness import HarnessContext, ToolFailure

VERSION = "1.18.33"
"""The version `scripts/install_codex_opencode.sh` installs and the tests run."""

INSTALL_DIR = Path(__file__).resolve().parents[3] / ".harness-bin"
"""Where the set-up script installs it: `.harness-bin/` in the checkout."""

PROVIDER = "reinforge"


def find_opencode() -> str:
    """The `opencode` command installed by the set-up script, else on PATH."""
    installed = INSTALL_DIR / "bin" / "opencode"
    found = str(installed) if installed.exists() else shutil.which("opencode")
    if found is None:
        raise InvalidRequestError(
            "OpenCode is not installed: run scripts/install_codex_opencode.sh "
            f"(npm install opencode-ai@{VERSION}), or pass OpenCode(executable=...)"
        )
    return found


@dataclass(frozen=True)
class OpenCode:
    """`context_window` and `max_output_tokens` are what OpenCode is told of the served model (each
    call's `max_tokens` is the latter)."""

    context_window: int = 32768
    max_output_tokens: int = 4096
    executable: str | None = None
    name: str = "opencode"
    address_space_mb: int | None = 16384
    """Bun reserves several GB of address space at start: under 4 GB it cannot start."""

    def config(self, ctx: HarnessContext) -> dict[str, Any]:
        return {
            "$schema": "https://opencode.ai/config.json",
            "provider": {
                PROVIDER: {
                    "npm": "@ai-sdk/openai-compatible",
                    "name": PROVIDER,
                    "options": {"baseURL": ctx.base_url, "apiKey": ctx.api_key},
                    "models": {
                        ctx.model: {
                            "name": ctx.model,
                            "tool_call": True,
                            "limit": {"context": self.context_window, "output": self.max_output_tokens},
                        }
                    },
                }
            },
            "model": f"{PROVIDER}/{ctx.model}",
            "small_model": f"{PROVIDER}/{ctx.model}",
            "autoupdate": False,
            "share": "disabled",
            "agent": {"title": {"disable": True}},
            "tools": {"task": False, "skill": False, "webfetch": False, "todowrite": False},
            # The sandbox confines it: a refused permission would end the run (`opencode run` stops).
            "permission": {
                "edit": "allow",
                "bash": "allow",
                "external_directory": "allow",
                "webfetch": "deny",
            },
        }

    def command(self, ctx: HarnessContext) -> list[str]:
        path = ctx.state_dir / "opencode.json"
        path.write_text(json.dumps(self.config(ctx), indent=2))
        exe = self.executable or find_opencode()
        return [exe, "run", "--model", f"{PROVIDER}/{ctx.model}", "--format", "json", ctx.instruction]

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        home = ctx.state_dir
        return {
            "OPENCODE_CONFIG": str(home / "opencode.json"),
            "XDG_CONFIG_HOME": str(home / "config"),
            "XDG_DATA_HOME": str(home / "data"),
            "XDG_CACHE_HOME": str(home / "cache"),
            "XDG_STATE_HOME": str(home / "state"),
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "NO_COLOR": "1",
        }

    def tool_failures(self, state_dir: Path) -> list[ToolFailure]:
        db = state_dir / "data" / "opencode" / "opencode.db"
        return db_failures(db) if db.exists() else []


def db_failures(db: Path) -> list[ToolFailure]:
    """Tool parts of OpenCode's db that failed: status `error` (a refused tool, a missing file, an
    edit that did not apply) or a bash call whose command exited non-zero."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT data FROM part ORDER BY time_created").fetchall()
    finally:
        conn.close()
    failures = []
    for (raw,) in rows:
        part = json.loads(raw)
        if not isinstance(part, dict) or part.get("type") != "tool":
            continue
        state = part.get("state") or {}
        exit_code = (state.get("metadata") or {}).get("exit")
        failed = state.get("status") == "error" or (isinstance(exit_code, int) and exit_code != 0)
        if failed:
            ended = (state.get("time") or {}).get("end") or (state.get("time") or {}).get("start") or 0
            detail = str(state.get("error") or state.get("output") or "")[:500]
            failures.append(ToolFailure(str(part.get("tool")), str(part.get("callID")), ended / 1000, detail))
    return failures
