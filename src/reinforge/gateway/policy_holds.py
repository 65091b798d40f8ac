"""Policy holds: a rollout's LLM calls wait until the policy version they must be sampled by is served.

Why: the trainer enqueues the next step's rollouts (and their agents start) before that step's
weights are published; their calls wait here instead of being answered by the older policy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.serving_loop import ServingLoop

_DROPPED = -1
"""The version a cancelled rollout's holds are set to: its waiting calls end with a 409."""


class PolicyHolds:
    """rollout id -> the policy version its calls wait for; released versions let them through."""

    def __init__(self, serving: ServingLoop) -> None:
        self._serving = serving
        self.versions: dict[str, int] = {}
        """rollout id -> the policy version its LLM calls wait for (read on every call: a dict, no call)."""
        self._released_version = -1
        self._changed: asyncio.Event | None = None

    def bind(self) -> None:
        """Make the wake-up event on the serving loop (called there, once)."""
        self._changed = asyncio.Event()

    @property
    def held(self) -> int:
        """Rollouts whose calls are held for a policy version not yet released."""
        return sum(1 for version in self.versions.values() if version > self._released_version)

    def hold(self, rollout_ids: Iterable[str], version: int) -> None:
        """Make these rollouts' calls wait for `version`; safe from any thread (it only adds entries)."""
        for rollout_id in rollout_ids:
            self.versions[rollout_id] = version

    def release(self, version: int) -> None:
        """Policy `version` is being served: let the calls held for it (or an older one) through."""
        self._serving.soon(lambda: self._release(version))

    def drop(self, rollout_ids: Iterable[str]) -> None:
        """These rollouts were cancelled: their held calls get a 409 instead of waiting on."""
        ids = list(rollout_ids)
        self._serving.soon(lambda: self._drop(ids))

    async def wait(self, rollout_id: str) -> None:
        """Wait while the rollout is held for a policy version not yet released (409 if dropped)."""
        while True:
            version = self.versions.get(rollout_id)
            if version is None or 0 <= version <= self._released_version:
                return
            if version == _DROPPED:
                del self.versions[rollout_id]
                raise GatewayHTTPError(
                    409,
                    f"rollout {rollout_id!r} was cancelled before the policy version its calls "
                    "were waiting for was published",
                    code="attempt_not_running",
                )
            assert self._changed is not None
            await self._changed.wait()

    def _release(self, version: int) -> None:
        self._released_version = max(self._released_version, version)
        for rollout_id, held_for in list(self.versions.items()):
            if 0 <= held_for <= version:
                del self.versions[rollout_id]
        self._wake()

    def _drop(self, rollout_ids: list[str]) -> None:
        for rollout_id in rollout_ids:
            if rollout_id in self.versions:
                self.versions[rollout_id] = _DROPPED
        self._wake()

    def _wake(self) -> None:
        if self._changed is not None:
            self._changed.set()
            self._changed = asyncio.Event()
