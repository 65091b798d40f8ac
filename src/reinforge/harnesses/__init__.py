"""Coding harnesses (mini-swe-agent, Claude Code, ...) as trainable agents: Harbor-layout tasks, a sandbox per
attempt, and the task's tests as the reward (docs/harnesses.md)."""

from reinforge.harnesses.agent import AttemptReport, HarnessAgent
from reinforge.harnesses.claude_code import ClaudeCode
from reinforge.harnesses.codex_cli import CodexCli
from reinforge.harnesses.harness import Harness, HarnessContext, ToolFailure
from reinforge.harnesses.mini_swe_agent import MiniSweAgent, bash_reply
from reinforge.harnesses.mini_swe_formats import PLAIN_BASH, ActionFormat
from reinforge.harnesses.opencode import OpenCode
from reinforge.harnesses.sandbox import (
    Limits,
    NamespaceSandbox,
    Sandbox,
    UnconfinedSandbox,
    default_sandbox,
    namespaces_available,
)
from reinforge.harnesses.tasks import TASK_KEY, HarborTask, load_task, load_tasks
from reinforge.harnesses.verifier import RewardMode, TestOutcome, score

__all__ = [
    "PLAIN_BASH",
    "TASK_KEY",
    "ActionFormat",
    "AttemptReport",
    "ClaudeCode",
    "CodexCli",
    "HarborTask",
    "Harness",
    "HarnessAgent",
    "HarnessContext",
    "Limits",
    "MiniSweAgent",
    "NamespaceSandbox",
    "OpenCode",
    "RewardMode",
    "Sandbox",
    "TestOutcome",
    "ToolFailure",
    "UnconfinedSandbox",
    "bash_reply",
    "default_sandbox",
    "load_task",
    "load_tasks",
    "namespaces_available",
    "score",
]
