"""Asynchronous rollouts with bounded staleness (`[trainer.schedule] max_staleness = k`, k ≥ 1).

The synchronous schedule waits, every step, for the slowest rollout of the step: one slow tool call
holds the whole update. Here up to k + 1 steps' worth of groups are in flight at once, enqueued with
the version serving when they are drawn and never held at the gateway, so the engine keeps sampling
while the trainer updates. A step trains on the first `tasks_per_step` groups that are complete
(every rollout of the group final: GRPO needs whole groups), whichever step drew them; groups still
running stay in flight for a later step, and a complete group none of whose transitions is within
the bound is dropped whole and does not count toward the step (a new one is drawn in its place).

Staleness is counted per transition: the version being updated minus the oldest version that
sampled the transition's tokens (`Transition.policy_version`, recorded by the gateway from the
backend that generated them). Transitions staler than k are dropped, after the group's advantages
were computed over the whole group, and counted; the rest are trained with the loss's truncated
importance weights (`tis_cap`) correcting for the lag.

A checkpoint records the in-flight groups (their dataset indices and rollout ids) and the counters.
On resume, groups whose rollouts all ended are collected as they are; the others (cancelled when the
previous session stopped) are enqueued again for the same tasks, and the counters carry on.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from reinforge.credit import CreditConfig, CreditMetrics
from reinforge.store.protocol import Store
from reinforge.training.config import RolloutSettings
from reinforge.training.data import TaskSampler
from reinforge.training.rollouts import attempt_resources, collect_transitions, rollout_specs
from reinforge.types import Rollout, RolloutMode, RolloutStatus, Transition

_POLL_S = 0.05
"""How long one wait on the store lasts before the in-flight set is looked at again."""


class InFlightGroup(BaseModel):
    """One task's group of rollouts, as a checkpoint records it."""

    model_config = ConfigDict(extra="forbid")

    group_id: str
    task_index: int = Field(ge=0)
    rollout_ids: list[str]
    enqueued_version: int = Field(ge=0)


class StalenessCounters(BaseModel):
    """Totals over the whole run (sessions before a resume included)."""

    model_config = ConfigDict(extra="forbid")

    trained: int = Field(default=0, ge=0, description="Transitions trained on.")
    dropped: int = Field(default=0, ge=0, description="Transitions dropped as staler than k.")
    staleness_sum: int = Field(default=0, ge=0, description="Sum of the trained transitions' staleness.")
    max: int = Field(default=0, ge=0, description="Largest staleness trained on.")
    groups_enqueued: int = Field(default=0, ge=0)


class AsyncRolloutState(BaseModel):
    """What a checkpoint keeps of the asynchronous schedule (`CheckpointMeta.extra["async_rollouts"]`)."""

    model_config = ConfigDict(extra="forbid")

    max_staleness: int = Field(ge=1)
    in_flight: list[InFlightGroup] = Field(default_factory=list)
    counters: StalenessCounters = Field(default_factory=StalenessCounters)


@dataclass
class AsyncBatch:
    """One step's training data: the complete groups' rollouts and every transition of them (for
    the advantages, which need whole groups); `fresh` marks the ones within the staleness bound."""

    rollouts: list[Rollout]
    transitions: list[Transition]
    fresh: list[bool]
    credit: CreditMetrics
    metrics: dict[str, float] = field(default_factory=dict)

    def trained(self, returns: list[float] | None) -> tuple[list[Transition], list[float] | None]:
        """The transitions (and PPO returns, aligned) that the update trains on."""
        kept = [t for t, ok in zip(self.transitions, self.fresh, strict=True) if ok]
        if returns is None:
            return kept, None
        return kept, [r for r, ok in zip(returns, self.fresh, strict=True) if ok]


@dataclass
class _Group:
    spec: InFlightGroup
    enqueued_at: float
    final: dict[str, Rollout] = field(default_factory=dict)
    transitions: list[Transition] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return len(self.final) == len(self.spec.rollout_ids)


class AsyncRollouts:
    """The asynchronous schedule's rollout pool: tops it up, collects groups as they complete, and
    hands each step the complete groups, with the stale transitions marked and counted."""

    def __init__(
        self,
        store: Store,
        sampler: TaskSampler,
        tasks: Sequence[dict[str, Any]],
        settings: RolloutSettings,
        credit: CreditConfig,
        *,
        max_staleness: int,
        group_size: int,
        prefix: str,
    ) -> None:
        if max_staleness < 1:
            raise ValueError("asynchronous rollouts need max_staleness >= 1")
        self._store = store
        self._sampler = sampler
        self._tasks = tasks
        self._settings = settings
        self._credit = credit
        self._k = max_staleness
        self._group_size = group_size
        self._prefix = prefix
        self._groups: list[_Group] = []
        self._counters = StalenessCounters()
        self._resumed: dict[str, float] = {}

    @property
    def max_staleness(self) -> int:
        return self._k

    @property
    def data_position(self) -> dict[str, Any]:
        """The sampler after every task drawn so far: the in-flight ones are in the checkpoint."""
        return self._sampler.state_dict()

    def state_dict(self) -> dict[str, Any]:
        state = AsyncRolloutState(
            max_staleness=self._k,
            in_flight=[g.spec for g in self._groups],
            counters=self._counters.model_copy(),
        )
        return state.model_dump(mode="json")

    async def restore(self, state: dict[str, Any], version: int) -> None:
        """Continue a checkpointed schedule: counters carry on; groups whose rollouts all ended
        are collected, the others enqueued again for the same tasks (at `version`)."""
        saved = AsyncRolloutState.model_validate(state)
        self._counters = saved.counters.model_copy()
        collected = requeued = 0
        for spec in saved.in_flight:
            found = {r.rollout_id: r for r in await self._store.wait_for_rollouts(spec.rollout_ids, 0.0)}
            ended = [found[i] for i in spec.rollout_ids if i in found]
            if len(ended) == len(spec.rollout_ids) and all(
                r.status.is_final and r.status != RolloutStatus.cancelled for r in ended
            ):
                group = _Group(spec, time.monotonic(), final={r.rollout_id: r for r in ended})
                group.transitions, _ = await collect_transitions(self._store, ended, self._credit)
                self._groups.append(group)
                collected += 1
            else:
                await self._enqueue([spec.task_index], version)
                requeued += 1
        self._resumed = {
            "async/resumed_collected": float(collected),
            "async/resumed_requeued": float(requeued),
        }

    async def next_batch(self, version: int, timeout_s: float) -> AsyncBatch:
        """Top the pool up to k + 1 steps' worth of groups, wait until `tasks_per_step` groups are
        complete (a group past `timeout_s` in flight has its stragglers cancelled), and take them.

        `version` is the policy the step updates: a transition's staleness is `version` minus the
        version that sampled it.
        """
        per_step = self._settings.tasks_per_step
        await self._top_up(version)
        started = time.monotonic()
        credit = CreditMetrics()
        stale: list[_Group] = []
        while True:
            useless = [g for g in self._groups if g.complete and self._all_stale(g, version)]
            for g in useless:  # nothing of it may be trained: it does not count for the step
                self._groups.remove(g)
            if useless:
                stale += useless
                await self._top_up(version)
            if sum(g.complete for g in self._groups) >= per_step:
                break
            credit = credit + await self._poll(timeout_s)
        ready = [g for g in self._groups if g.complete][:per_step]
        for g in ready:
            self._groups.remove(g)
        waited = time.monotonic() - started
        return self._batch(ready, stale, version, credit, waited)

    async def _top_up(self, version: int) -> None:
        """Draw new groups until k + 1 steps' worth are in flight, sampled from `version` on."""
        want = self._settings.tasks_per_step * (self._k + 1) - len(self._groups)
        if want > 0:
            await self._enqueue(self._sampler.next_batch(want), version)

    def _all_stale(self, group: _Group, version: int) -> bool:
        return bool(group.transitions) and all(
            version - t.policy_version > self._k for t in group.transitions
        )

    async def cancel_in_flight(self) -> None:
        """Cancel the groups still running (the fit ends; a checkpoint already recorded them)."""
        running = [i for g in self._groups for i in g.spec.rollout_ids if i not in g.final]
        if running:
            await self._store.cancel_rollouts(running)

    async def _enqueue(self, indices: Sequence[int], version: int) -> None:
        resources = attempt_resources(version, self._settings.sampling_at(self._settings.temperature))
        rv = await self._store.put_resources(resources)
        number = self._counters.groups_enqueued
        self._counters.groups_enqueued += len(indices)
        # One spec list per group keeps the ids unique across batches and sessions: `<prefix>-g<n>`.
        specs = []
        for offset, index in enumerate(indices):
            specs += rollout_specs(
                [(index, self._tasks[index])],
                prefix=f"{self._prefix}-g{number + offset}",
                group_size=self._group_size,
                mode=RolloutMode.train,
                resources_version=rv.version,
            )
        enqueued = await self._store.enqueue_rollouts(specs)
        now = time.monotonic()
        for offset, index in enumerate(indices):
            group_id = f"{self._prefix}-g{number + offset}-0"
            members = [r for r in enqueued if r.group_id == group_id]
            spec = InFlightGroup(
                group_id=group_id,
                task_index=index,
                rollout_ids=[r.rollout_id for r in members],
                enqueued_version=version,
            )
            self._groups.append(_Group(spec, now))

    async def _poll(self, timeout_s: float) -> CreditMetrics:
        """Wait a moment for rollouts to end; read the spans of those that did."""
        now = time.monotonic()
        late = [
            i
            for g in self._groups
            if now - g.enqueued_at > timeout_s
            for i in g.spec.rollout_ids
            if i not in g.final
        ]
        fresh: list[Rollout] = []
        if late:
            fresh += [r for r in await self._store.cancel_rollouts(late) if r.status.is_final]
        pending = [i for g in self._groups for i in g.spec.rollout_ids if i not in g.final and i not in late]
        if pending:
            fresh += [r for r in await self._store.wait_for_rollouts(pending, _POLL_S) if r.status.is_final]
        else:
            await asyncio.sleep(0)
        if not fresh:
            return CreditMetrics()
        transitions, credit = await collect_transitions(self._store, fresh, self._credit)
        by_rollout: dict[str, list[Transition]] = {}
        for t in transitions:
            by_rollout.setdefault(t.rollout_id, []).append(t)
        owner = {i: g for g in self._groups for i in g.spec.rollout_ids}
        for r in fresh:
            group = owner[r.rollout_id]
            if r.rollout_id not in group.final:
                group.final[r.rollout_id] = r
                group.transitions += by_rollout.get(r.rollout_id, [])
        return credit

    def _batch(
        self, groups: list[_Group], stale: list[_Group], version: int, credit: CreditMetrics, waited: float
    ) -> AsyncBatch:
        rollouts = [g.final[i] for g in groups for i in g.spec.rollout_ids]
        transitions = [t for g in groups for t in g.transitions]
        staleness = [version - t.policy_version for t in transitions]
        fresh = [s <= self._k for s in staleness]
        kept = [s for s, ok in zip(staleness, fresh, strict=True) if ok]
        dropped = len(transitions) - len(kept) + sum(len(g.transitions) for g in stale)
        c = self._counters
        c.trained += len(kept)
        c.dropped += dropped
        c.staleness_sum += sum(kept)
        c.max = max([c.max, *kept])
        metrics = {
            "staleness/mean": sum(kept) / len(kept) if kept else 0.0,
            "staleness/max": float(max(kept, default=0)),
            "staleness/trained": float(len(kept)),
            "staleness/dropped": float(dropped),
            "staleness/trained_total": float(c.trained),
            "staleness/dropped_total": float(c.dropped),
            "staleness/mean_total": c.staleness_sum / c.trained if c.trained else 0.0,
            "staleness/max_total": float(c.max),
            "async/groups_in_flight": float(len(self._groups)),
            "async/groups_trained": float(len(groups)),
            "async/groups_dropped": float(len(stale)),
            "async/wait_s": waited,
            **self._resumed,
        }
        self._resumed = {}
        return AsyncBatch(
            rollouts=rollouts, transitions=transitions, fresh=fresh, credit=credit, metrics=metrics
        )
