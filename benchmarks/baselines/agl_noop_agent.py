"""The noop agent for agentlightning 1.0.2's local controller: one chat completion, then a reward.

Its controller runs `NoopAgent().run()` in a fresh Python process per rollout, with the rollout's
proxy endpoint in AGL_OPENAI_BASE_URL and its event URL in AGL_EVENT_URL (see
`agentlightning.controller.local_reconciler`). It uses httpx, which the baseline's venv has.
"""

from __future__ import annotations

import os

import httpx


class NoopAgent:
    def run(self) -> None:
        key = os.environ.get("AGL_KEY") or "unused"
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.Client(timeout=60, headers=headers) as client:
            reply = client.post(
                os.environ["AGL_OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
                json={
                    "model": "policy",
                    "messages": [{"role": "user", "content": "What is 2 + 2?"}],
                    "max_tokens": 16,
                },
            )
            reply.raise_for_status()
            answer = reply.json()["choices"][0]["message"]["content"]
            reward = {"event_type": "reward", "data": {"value": 1.0 if answer else 0.0}}
            client.post(os.environ["AGL_EVENT_URL"], json=reward).raise_for_status()
