"""Which resources (model name, prompt templates, ...) an attempt runs with.

A rollout tagged with a resources version gets exactly that version (versions are immutable, so they
are cached forever). An untagged rollout gets the latest version. That is re-fetched when the cached
one is older than `max_age_s` or than the rollout itself, so "put resources, then enqueue" always
shows the agent the new version, without a store call per attempt. A version the cache lacks is
fetched once however many attempts ask for it at the same moment (a lease batch starts them together).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from reinforge.errors import NotFoundError
from reinforge.store.protocol import Store
from reinforge.types import ResourcesVersion, Rollout


def model_from_resources(resources: dict[str, Any], default: str) -> str:
    """The model name agents should ask for: `resources["llm"]["model"]`, else `resources["model"]`."""
    llm = resources.get("llm")
    if isinstance(llm, dict) and isinstance(llm.get("model"), str):
        return str(llm["model"])
    if isinstance(resources.get("model"), str):
        return str(resources["model"])
    return default


@dataclass(frozen=True)
class ResolvedResources:
    version: int | None
    """None when the store holds no resources yet."""
    resources: dict[str, Any]


class ResourcesCache:
    def __init__(self, store: Store, max_age_s: float = 1.0) -> None:
        self._store = store
        self._max_age_s = max_age_s
        self._versions: dict[int, ResourcesVersion] = {}
        self._fetching: dict[int, asyncio.Future[ResourcesVersion]] = {}
        self._latest: ResourcesVersion | None = None
        self._fetched_at: float | None = None

    async def prefetch(self, rollouts: Sequence[Rollout]) -> None:
        """Fetch the versions a new lease batch is tagged with, and refresh the latest version when an
        untagged rollout of the batch needs a fresher one. A failed fetch is left to the attempts."""
        for version in {r.resources_version for r in rollouts} - {None} - self._versions.keys():
            assert version is not None
            try:
                await self._version(version)
            except Exception:
                continue  # each attempt asks again and reports its own failure
        untagged = [r.created_at for r in rollouts if r.resources_version is None]
        if not untagged:
            return
        now = time.time()
        fetched_at = self._fetched_at
        if fetched_at is not None and fetched_at > max(untagged) and now - fetched_at < self._max_age_s:
            return
        try:
            self._latest = await self._store.get_resources(None)
            self._versions[self._latest.version] = self._latest
        except NotFoundError:
            self._latest = None
        self._fetched_at = now

    async def get(self, version: int | None) -> ResolvedResources:
        if version is None:
            if self._fetched_at is None:
                await self.prefetch([Rollout(rollout_id="-")])
            latest = self._latest
            if latest is None:
                return ResolvedResources(None, {})
            return ResolvedResources(latest.version, latest.resources)
        found = self._versions.get(version)
        if found is None:
            # A missing version is the trainer's bug; the attempt fails (retryably) with a clear error.
            found = await self._version(version)
        return ResolvedResources(found.version, found.resources)

    async def _version(self, version: int) -> ResourcesVersion:
        """One store read per version, shared by everyone who asks while it is on its way."""
        fetching = self._fetching.get(version)
        if fetching is None:
            fetching = self._fetching[version] = asyncio.ensure_future(self._store.get_resources(version))
            try:
                found = await asyncio.shield(fetching)
            finally:
                del self._fetching[version]
            self._versions[version] = found
            return found
        return await asyncio.shield(fetching)
