"""Claude Code (npm `@anthropic-ai/claude-code`, `scripts/install_claude_code.sh`) as a harness.

Started as its own `claude -p <instruction>` command, unchanged, with the Anthropic Messages API
pointed at the gateway: `ANTHROPIC_BASE_URL` (the attempt's base URL without `/v1`; the SDK adds
`/v1/messages`) and `ANTHROPIC_API_KEY` (the attempt's key, sent as `x-api-key`). What it sends and
reads (version 2.1.112, from its cli.js and from its requests; docs/harnesses.md): a HEAD to the base
URL at start-up, then `POST /v1/messages?beta=true` with `stream: true`, `system` text blocks with
`cache_control`, `metadata.user_id`, `thinking: {"type": "adaptive"}`, `context_management`,
`output_config.effort`, its own tools (Bash, Read, Edit, Write, ...) and `anthropic-beta` headers.

The variables below switch off what a training run must not do or cannot serve: telemetry, error
reports, the auto-updater and other non-essential traffic (there is no network but the gateway),
history compaction (it rewrites earlier turns, so calls would no longer merge; a prompt that outgrows
the context gets the API's "prompt is too long" and the attempt ends), and long retry loops meant for
a remote API. Side calls for a "small fast model" and subagents name the served model too.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from reinforge.errors import InvalidRequestError
from reinforge.harnesses.harness import HarnessContext

VERSION = "2.1.112"
"""The version `scripts/install_claude_code.sh` installs and the tests run."""

INSTALL_DIR = Path(__file__).resolve().parents[3] / ".harness-bin"
"""Where the set-up script installs it: `.harness-bin/` in the checkout."""

DEFAULT_TOOLS = ("Bash", "Read", "Edit", "Write", "Glob", "Grep")
"""Its built-in tools the model may use without being asked (`--allowedTools`): a headless run has
nobody to grant a permission, and a tool it is refused comes back to the model as an error."""


def find_claude() -> str:
    """The `claude` command installed by the set-up script, else on PATH."""
    installed = INSTALL_DIR / "bin" / "claude"
    found = str(installed) if installed.exists() else shutil.which("claude")
    if found is None:
        raise InvalidRequestError(
            "Claude Code is not installed: run scripts/install_claude_code.sh "
            f"(npm install @anthropic-ai/claude-code@{VERSION}), or pass ClaudeCode(executable=...)"
        )
    return found


@dataclass(frozen=True)
class ClaudeCode:
    """`max_turns` bounds its model calls (`--max-turns`); `tools` are its built-in tools it may use
    unasked; `max_output_tokens` is each call's `max_tokens` (its own default is 32000); `api_retries`
    how often it resends a failed call (its default, 10 with back-off, is meant for a remote API)."""

    max_turns: int = 30
    tools: tuple[str, ...] = DEFAULT_TOOLS
    max_output_tokens: int = 4096
    api_retries: int = 1
    heap_mb: int = 2048
    """Node's heap limit (`--max-old-space-size`): what bounds its memory, as the address space can't."""
    executable: str | None = None
    name: str = "claude-code"
    address_space_mb: int | None = 16384
    """Node reserves about 10 GB of address space for each WebAssembly memory (its HTTP client's
    parser is one): below this its connections fail ("Unable to connect to API")."""

    def command(self, ctx: HarnessContext) -> list[str]:
        return [
            self.executable or find_claude(),
            "--print", ctx.instruction,
            "--model", ctx.model,
            "--max-turns", str(self.max_turns),
            "--allowedTools", ",".join(self.tools),
            "--output-format", "stream-json",
            "--verbose",
        ]  # fmt: skip

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "ANTHROPIC_BASE_URL": ctx.base_url.removesuffix("/").removesuffix("/v1"),
            "ANTHROPIC_API_KEY": ctx.api_key,
            "ANTHROPIC_SMALL_FAST_MODEL": ctx.model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": ctx.model,
            "CLAUDE_CODE_SUBAGENT_MODEL": ctx.model,
            "CLAUDE_CONFIG_DIR": str(ctx.state_dir / "claude"),
            "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(self.max_output_tokens),
            "CLAUDE_CODE_MAX_RETRIES": str(self.api_retries),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_TELEMETRY": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_AUTO_COMPACT": "1",
            "DISABLE_COMPACT": "1",
            "NODE_OPTIONS": f"--max-old-space-size={self.heap_mb}",
        }
