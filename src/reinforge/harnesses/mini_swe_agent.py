"""mini-swe-agent (`pip install mini-swe-agent`, the `[harnesses]` extra) as a harness.

Started as its own `mini` command, unchanged, with its text-based config (`mini_textbased.yaml`:
one ```mswea_bash_command block per reply) and litellm's OpenAI route (`openai/<model>`), so
every call is a chat completion to the gateway. What it reads (minisweagent 2.4, from its code):
`OPENAI_API_KEY` / `OPENAI_BASE_URL` (litellm's OpenAI provider), `MSWEA_CONFIGURED` (skip the
first-run questions), `MSWEA_GLOBAL_CONFIG_DIR` (its .env and trajectories), `MSWEA_COST_TRACKING`
(a local model has no price), `MSWEA_SILENT_STARTUP`, `MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT`;
litellm's `LITELLM_LOCAL_MODEL_COST_MAP` keeps it from fetching its price list from the network at import.
`action_format` swaps the reply format through its own config keys (`mini_swe_formats.PLAIN_BASH`
for small models that never write its ```mswea_bash_command tag).
"""

from __future__ import annotations

import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from reinforge.errors import InvalidRequestError
from reinforge.harnesses.harness import HarnessContext
from reinforge.harnesses.mini_swe_formats import SUBMIT, ActionFormat

CONFIG = "mini_textbased.yaml"
"""mini-swe-agent's own config for models answering in fenced bash blocks (no tool calls)."""

__all__ = ["CONFIG", "SUBMIT", "MiniSweAgent", "bash_reply", "find_mini"]


def bash_reply(command: str, thought: str = "I will run this next.") -> str:
    """One reply in mini-swe-agent's text-based format (what a capable model writes)."""
    return f"THOUGHT: {thought}\n\n```mswea_bash_command\n{command}\n```"


def find_mini() -> str:
    """The `mini` executable beside this Python, else on PATH."""
    beside = Path(sys.executable).with_name("mini")
    found = str(beside) if beside.is_file() else shutil.which("mini")
    if found is None:
        raise InvalidRequestError(
            "mini-swe-agent is not installed: pip install 'reinforge[harnesses]' (or mini-swe-agent)"
        )
    return found


@dataclass(frozen=True)
class MiniSweAgent:
    """`step_limit` bounds its model calls; `command_timeout_s` each bash command it runs;
    `model_attempts` how often it sends a call the gateway refused (its own default is 10, with
    back-off up to a minute: meant for a remote API, not a local gateway). `action_format` replaces
    its reply format and prompts (None: its own ```mswea_bash_command format)."""

    step_limit: int = 30
    command_timeout_s: int = 60
    model_attempts: int = 2
    executable: str | None = None
    name: str = "mini-swe-agent"
    address_space_mb: int | None = None
    action_format: ActionFormat | None = None

    def command(self, ctx: HarnessContext) -> list[str]:
        return [
            self.executable or find_mini(),
            "--model", f"openai/{ctx.model}",
            "--model-class", "litellm_textbased",
            "--agent-class", "default",
            "--environment-class", "local",
            "--config", CONFIG,
            *(self.action_format.config_args() if self.action_format is not None else []),
            "--config", f"agent.step_limit={self.step_limit}",
            "--config", f"environment.timeout={self.command_timeout_s}",
            "--config", f"environment.cwd={ctx.workdir}",
            "--cost-limit", "0",
            "--yolo",
            "--exit-immediately",
            "--output", str(ctx.state_dir / "trajectory.json"),
            "--task", ctx.instruction,
        ]  # fmt: skip

    def env(self, ctx: HarnessContext) -> dict[str, str]:
        return {
            "OPENAI_API_KEY": ctx.api_key,
            "OPENAI_BASE_URL": ctx.base_url,
            "OPENAI_API_BASE": ctx.base_url,
            "MSWEA_CONFIGURED": "true",
            "MSWEA_GLOBAL_CONFIG_DIR": str(ctx.state_dir / "mini-swe-agent"),
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_SILENT_STARTUP": "1",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(self.model_attempts),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "LITELLM_LOG": "ERROR",
        }
