"""What a harness is to the runner: a command line and an environment, built per attempt.

A harness runs unchanged: only the variables and flags its own documentation offers point it at the
gateway (its base URL, as reachable inside the sandbox) with the attempt's key.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol


@dataclass(frozen=True)
class HarnessContext:
    """What one attempt's harness command is built from."""

    instruction: str
    base_url: str
    """The gateway's OpenAI base URL (`.../v1`) as a process inside the sandbox reaches it."""
    api_key: str
    model: str
    workdir: Path
    """The attempt's working directory (the task's environment files); the harness starts in it."""
    state_dir: Path
    """A writable directory of the attempt's own (the harness's home, config and trajectory)."""
    timeout_s: float


@dataclass(frozen=True)
class ToolFailure:
    """A tool call the harness itself recorded as failed (a command's non-zero exit, a patch that did
    not apply): reported as an AIR `tool_error`, timed when the tool ended so that credit charges it
    to the call that asked for the tool (the latest call before it)."""

    tool: str
    call_id: str
    ended_at: float
    """Unix seconds."""
    detail: str = ""


class Harness(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def address_space_mb(self) -> int | None:
        """The least address space (`RLIMIT_AS`) each of its processes needs, whatever memory cap the
        agent sets, or None. Node.js reserves about 10 GB of address space per WebAssembly memory (its
        HTTP client is one): under a 4 GB cap Claude Code cannot open a connection. Such a harness
        bounds its real memory its own way (Node's heap limit)."""

    def command(self, ctx: HarnessContext) -> list[str]: ...

    def env(self, ctx: HarnessContext) -> dict[str, str]: ...
