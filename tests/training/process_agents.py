"""Agents for the runner-process tests: importable by name, as `reinforge runner` children need."""

from __future__ import annotations

import os
from typing import Any

from reinforge.runner import LLM, Agent, agent


@agent(name="exits")
def exiting_agent(task: dict[str, Any], llm: LLM) -> float:
    """Ends its whole process on the first attempt: a runner child that dies mid-step."""
    os._exit(3)


class ClassAgent(Agent):
    name = "class-agent"

    def rollout(self, task: dict[str, Any], llm: LLM) -> float:
        return 1.0


SHARED_INSTANCE = ClassAgent()
