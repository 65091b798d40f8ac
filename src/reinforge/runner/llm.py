"""`LLM`: what an agent is given to reach the policy, ready for any OpenAI-compatible client.

    client = openai.OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    client.chat.completions.create(model=llm.model, messages=...)

The key names the attempt, so every call the agent makes is recorded for it, and the base URL is one
for all attempts (`<gateway>/v1`): a framework that caches an HTTP client per base URL reuses it
across rollouts. `for_agent(name)` gives an endpoint tagged with an agent name, for selective
training in multi-agent systems (`/r/<attempt>/v1` also still names the attempt by its URL).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import quote

from reinforge.errors import InvalidRequestError


def attempt_url(gateway_url: str, attempt_id: str) -> str:
    """The gateway's root for one attempt (`.../r/<attempt_id>`)."""
    return f"{gateway_url.rstrip('/')}/r/{quote(attempt_id, safe='')}"


@dataclass(frozen=True)
class LLM:
    """The policy endpoint of one attempt, plus the resources version the attempt runs with."""

    base_url: str
    """An OpenAI base URL (ends in `/v1`), the same for every attempt of a gateway."""
    api_key: str
    """The attempt's own bearer token; it opens only this attempt."""
    model: str
    resources: dict[str, Any] = field(default_factory=dict)
    """The resources the rollout runs with (prompt templates, ...); see `resources_version`."""
    resources_version: int | None = None
    agent_name: str | None = None
    attempt_root: str = field(default="", repr=False)
    """`attempt_url(...)`; `for_agent` derives tagged endpoints from it."""

    @classmethod
    def for_attempt(
        cls,
        gateway_url: str,
        attempt_id: str,
        api_key: str,
        model: str,
        resources: dict[str, Any] | None = None,
        resources_version: int | None = None,
    ) -> LLM:
        root = attempt_url(gateway_url, attempt_id)
        return cls(
            base_url=f"{gateway_url.rstrip('/')}/v1",
            api_key=api_key,
            model=model,
            resources=dict(resources or {}),
            resources_version=resources_version,
            attempt_root=root,
        )

    def for_agent(self, name: str) -> LLM:
        """The same endpoint, with calls recorded under agent `name`."""
        if not name or "/" in name:
            raise InvalidRequestError(f"an agent name must be non-empty and contain no '/', got {name!r}")
        if not self.attempt_root:
            raise InvalidRequestError(
                "this LLM was not made by a runner (no attempt URL); can't tag an agent"
            )
        gateway = self.attempt_root.rsplit("/r/", 1)[0]
        return replace(self, base_url=f"{gateway}/agents/{quote(name, safe='')}/v1", agent_name=name)

    @property
    def reward_url(self) -> str:
        """Where `POST {"reward": <float>}` records a reward for this attempt."""
        return f"{self.attempt_root}/reward"
