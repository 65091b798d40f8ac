"""The run's sampling for each call: which `RunSampling` an attempt's rollout was published with.

Why a cache: a rollout's resources version is fixed when it is enqueued and a resources version
never changes, so each is read from the store once (a co-located runner's lease spares even that,
`remember`); after that, finding a call's sampling is two dict lookups.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from reinforge import semconv
from reinforge.inference.contract import SamplingParams
from reinforge.inference.run_sampling import RunSampling
from reinforge.store.protocol import Store
from reinforge.types import Rollout

_NO_VERSION = -1
"""A rollout enqueued without resources: the run publishes no sampling for it."""


def _summary(sampling: SamplingParams) -> dict[str, Any]:
    return {
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "max_tokens": sampling.max_tokens,
    }


@dataclass(frozen=True, slots=True)
class AppliedSampling:
    """What a call asked for and what the backend was given, for its span."""

    asked: SamplingParams
    applied: SamplingParams
    run: RunSampling | None

    def attributes(self) -> dict[str, Any]:
        owner = "run" if self.run is not None and self.run.owner == "run" else "agent"
        return {
            semconv.ATTR_SAMPLING_ASKED: _summary(self.asked),
            semconv.ATTR_SAMPLING_APPLIED: _summary(self.applied),
            semconv.ATTR_SAMPLING_OWNER: owner,
        }


class RunSamplings:
    """Each rollout's `RunSampling` (None when its resources publish none), read once."""

    def __init__(self, store: Store, max_rollouts: int = 100_000, max_versions: int = 1024) -> None:
        self._store = store
        self._max_rollouts = max_rollouts
        self._max_versions = max_versions
        self._versions: dict[str, int] = {}
        self._samplings: dict[int, RunSampling | None] = {}

    def remember(self, rollouts: Iterable[Rollout]) -> None:
        """The resources versions of rollouts a co-located runner has just leased (safe from any
        thread: it only adds entries)."""
        for rollout in rollouts:
            self._keep_version(rollout.rollout_id, rollout.resources_version)

    async def of_rollout(self, rollout_id: str) -> RunSampling | None:
        """The run's sampling for the calls of `rollout_id`."""
        version = self._versions.get(rollout_id)
        if version is None:
            rollout = await self._store.get_rollout(rollout_id)
            version = self._keep_version(rollout_id, rollout.resources_version)
        if version == _NO_VERSION:
            return None
        if version not in self._samplings:
            resources = await self._store.get_resources(version)
            if len(self._samplings) >= self._max_versions:
                self._samplings.pop(next(iter(self._samplings)))
            self._samplings[version] = RunSampling.of_resources(resources.resources)
        return self._samplings[version]

    def _keep_version(self, rollout_id: str, version: int | None) -> int:
        if len(self._versions) >= self._max_rollouts:  # the oldest quarter goes (insertion order)
            for key in list(self._versions)[: self._max_rollouts // 4]:
                del self._versions[key]
        kept = _NO_VERSION if version is None else version
        self._versions[rollout_id] = kept
        return kept
