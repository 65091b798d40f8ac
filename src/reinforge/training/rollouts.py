"""Run a batch of rollouts through the store and read them back as transitions.

The trainer never runs agents itself: it enqueues rollout specs (tagged with a resources version and,
for training, a group id per task) and waits for runners to finish them. Stragglers past the step's
deadline are cancelled, so one stuck agent can't stall training.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from reinforge import semconv
from reinforge.credit import CreditConfig, CreditMetrics, build_transitions
from reinforge.inference.run_sampling import SAMPLING_RESOURCE, RunSampling
from reinforge.stack.settings import MODEL_NAME
from reinforge.store.protocol import Store
from reinforge.training.config import RolloutSettings
from reinforge.training.data import TaskSampler
from reinforge.training.rollout_stack import RolloutStack
from reinforge.training.scheduling import EnqueuedStep
from reinforge.types import (
    MAX_PAGE_SIZE,
    Attempt,
    AttemptQuery,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanQuery,
    Transition,
)

_READS_AT_ONCE = 256
"""Rollouts whose spans are read by one paged query, and whose attempts concurrently."""


def attempt_resources(policy_version: int, sampling: RunSampling) -> dict[str, Any]:
    """What an attempt is given: the model name, the policy version and how it is sampled (which
    the gateway applies, `reinforge.inference.run_sampling`)."""
    return {
        "llm": {"model": MODEL_NAME},
        "policy_version": policy_version,
        SAMPLING_RESOURCE: sampling.resource(),
    }


class TrainingRollouts:
    """The training steps' rollouts (the scheduler's `RolloutQueue`): each step draws its tasks from
    the sampler and enqueues each task `group_size` times, with the resources of the policy version
    that samples them. Rollout ids are `<prefix>-s<step>-<task>-<member>`."""

    def __init__(
        self,
        store: Store,
        stack: RolloutStack,
        sampler: TaskSampler,
        tasks: Sequence[dict[str, Any]],
        settings: RolloutSettings,
        *,
        group_size: int,
        prefix: str,
    ) -> None:
        self._store = store
        self._stack = stack
        self._sampler = sampler
        self._tasks = tasks
        self._settings = settings
        self._group_size = group_size
        self._prefix = prefix

    async def enqueue(self, step: int, policy_version: int, *, hold: bool) -> EnqueuedStep:
        indices = self._sampler.next_batch(self._settings.tasks_per_step)
        position = self._sampler.state_dict()
        resources = attempt_resources(policy_version, self._settings.sampling_at(self._settings.temperature))
        rv = await self._store.put_resources(resources)
        specs = rollout_specs(
            [(i, self._tasks[i]) for i in indices],
            prefix=f"{self._prefix}-s{step}",
            group_size=self._group_size,
            mode=RolloutMode.train,
            resources_version=rv.version,
        )
        if hold:
            self._stack.hold([str(s.rollout_id) for s in specs], policy_version)
        ids = [r.rollout_id for r in await self._store.enqueue_rollouts(specs)]
        return EnqueuedStep(number=step, rollout_ids=ids, data_position=position)

    async def cancel(self, step: EnqueuedStep) -> None:
        await self._store.cancel_rollouts(step.rollout_ids)
        self._stack.drop_holds(step.rollout_ids)


def task_key(task: dict[str, Any], index: int) -> str:
    """A task's id for grouping and reports: its own `task_id`/`id` field, else its dataset index."""
    for key in ("task_id", "id"):
        value = task.get(key)
        if isinstance(value, str | int) and str(value):
            return str(value)[:128]
    return f"task-{index}"


async def run_rollouts(store: Store, specs: Sequence[RolloutSpec], timeout_s: float) -> list[Rollout]:
    """Enqueue the rollouts (`rollout_specs`) and return them once final (`finish_rollouts`)."""
    ids = [r.rollout_id for r in await store.enqueue_rollouts(specs)]
    return await finish_rollouts(store, ids, timeout_s)


def rollout_specs(
    tasks: Sequence[tuple[int, dict[str, Any]]],
    *,
    prefix: str,
    group_size: int,
    mode: RolloutMode,
    resources_version: int,
    max_attempts: int = 2,
) -> list[RolloutSpec]:
    """Each (dataset index, task) `group_size` times, one group per task, ids based on `prefix`."""
    return [
        RolloutSpec(
            rollout_id=f"{prefix}-{n}-{g}",
            task=task,
            task_id=task_key(task, index),
            mode=mode,
            group_id=f"{prefix}-{n}",
            resources_version=resources_version,
            max_attempts=max_attempts,
        )
        for n, (index, task) in enumerate(tasks)
        for g in range(group_size)
    ]


async def finish_rollouts(store: Store, ids: Sequence[str], timeout_s: float) -> list[Rollout]:
    """Wait up to `timeout_s` for rollouts to be final, cancel the stragglers, return them in order."""
    finished = {r.rollout_id: r for r in await store.wait_for_rollouts(ids, timeout_s)}
    late = [i for i in ids if i not in finished]
    if late:
        for r in await store.cancel_rollouts(late):
            finished[r.rollout_id] = r
    return [finished[i] for i in ids if i in finished]


async def cancel_unfinished(store: Store) -> int:
    """Cancel rollouts a previous (killed) session left queued or running; returns how many."""
    cancelled = 0
    while True:
        page = await store.query_rollouts(
            RolloutQuery(statuses=[RolloutStatus.queued, RolloutStatus.running], limit=MAX_PAGE_SIZE)
        )
        if not page.items:
            return cancelled
        done = await store.cancel_rollouts([r.rollout_id for r in page.items])
        cancelled += len(done)
        if len(done) == 0:
            return cancelled


async def _spans_of(store: Store, rollout_ids: Sequence[str]) -> dict[str, list[Span]]:
    """Every span of these rollouts, by rollout, in one paged read (not a query per rollout)."""
    by_rollout: dict[str, list[Span]] = {i: [] for i in rollout_ids}
    offset: int | None = 0
    while offset is not None:
        page = await store.query_spans(
            SpanQuery(rollout_ids=list(rollout_ids), limit=MAX_PAGE_SIZE, offset=offset)
        )
        for span in page.items:
            by_rollout[span.rollout_id].append(span)
        offset = page.next_offset
    return by_rollout


async def _attempts(store: Store, rollout: Rollout) -> list[Attempt]:
    """The rollout's attempt records, which credit/ needs only to pick among attempts or to see how
    one ended: a rollout that succeeded on its first attempt has one attempt, and it succeeded."""
    if rollout.status == RolloutStatus.succeeded and rollout.attempt_count == 1:
        return []
    page = await store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id, limit=MAX_PAGE_SIZE))
    return page.items


async def collect_transitions(
    store: Store, rollouts: Sequence[Rollout], credit: CreditConfig
) -> tuple[list[Transition], CreditMetrics]:
    """Transitions of every final rollout, with the credit metrics summed over them.

    The reads are issued together: the SQLite store answers reads queued in one loop turn in one
    transaction, and a remote store takes them concurrently, instead of one round trip after another.
    """
    transitions: list[Transition] = []
    total = CreditMetrics()
    final = [r for r in rollouts if r.status.is_final]
    for found, metrics in await _transitions_of(store, final, credit):
        transitions += found
        total = total + metrics
    return transitions, total


async def finish_and_collect(
    store: Store, ids: Sequence[str], timeout_s: float, credit: CreditConfig, poll_s: float = 0.05
) -> tuple[list[Rollout], list[Transition], CreditMetrics]:
    """`finish_rollouts`, then `collect_transitions` of them, but each rollout's spans are read as
    soon as it is final, while the others still run: when the last one ends, only its own spans are
    left to read instead of the whole batch's (on the step's critical path).

    Everything comes back in the order of `ids`, whatever order the rollouts finished in.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    final: dict[str, Rollout] = {}
    found: dict[str, tuple[list[Transition], CreditMetrics]] = {}
    while len(final) < len(ids):
        left = deadline - loop.time()
        pending = [i for i in ids if i not in final]
        if left <= 0:
            for r in await store.cancel_rollouts(pending):
                final[r.rollout_id] = r
            fresh = [final[i] for i in pending if i in final]
        else:
            ready = await store.wait_for_rollouts(pending, min(poll_s, left))
            fresh = [r for r in ready if r.status.is_final]
            final.update((r.rollout_id, r) for r in fresh)
        for rollout, result in zip(fresh, await _transitions_of(store, fresh, credit), strict=True):
            found[rollout.rollout_id] = result
        if left <= 0:
            break
    rollouts = [final[i] for i in ids if i in final]
    transitions: list[Transition] = []
    total = CreditMetrics()
    for rollout in rollouts:
        its_transitions, metrics = found[rollout.rollout_id]
        transitions += its_transitions
        total = total + metrics
    return rollouts, transitions, total


async def _transitions_of(
    store: Store, rollouts: Sequence[Rollout], credit: CreditConfig
) -> list[tuple[list[Transition], CreditMetrics]]:
    """Each final rollout's transitions and credit metrics (reads issued together, as below)."""
    spans: list[list[Span]] = []
    attempts: list[list[Attempt]] = []
    for i in range(0, len(rollouts), _READS_AT_ONCE):
        chunk = rollouts[i : i + _READS_AT_ONCE]
        by_rollout = await _spans_of(store, [r.rollout_id for r in chunk])
        spans += [by_rollout[r.rollout_id] for r in chunk]
        attempts += await asyncio.gather(*(_attempts(store, r) for r in chunk))
    return [
        build_transitions(rollout, its_spans, credit, attempts=its_attempts)
        for rollout, its_spans, its_attempts in zip(rollouts, spans, attempts, strict=True)
    ]


def success_rate(rollouts: Sequence[Rollout], threshold: float = 1.0) -> float:
    """Share of rollouts whose reward reached `threshold` (failed or cancelled ones count as misses)."""
    if not rollouts:
        return 0.0
    hits = sum(
        1
        for r in rollouts
        if r.status == RolloutStatus.succeeded and r.reward is not None and r.reward >= threshold
    )
    return hits / len(rollouts)


async def mean_llm_calls(store: Store, rollouts: Sequence[Rollout]) -> float:
    """Model calls per rollout, averaged over `rollouts` (0.0 for none): each rollout's calls are its
    LLM spans of the attempt that reported last (a retried rollout's earlier try does not count)."""
    if not rollouts:
        return 0.0
    total = 0
    ids = [r.rollout_id for r in rollouts]
    for start in range(0, len(ids), _READS_AT_ONCE):
        chunk = ids[start : start + _READS_AT_ONCE]
        by_attempt: dict[str, dict[str, int]] = {i: {} for i in chunk}
        last: dict[str, str] = {}
        offset: int | None = 0
        while offset is not None:
            page = await store.query_spans(
                SpanQuery(rollout_ids=chunk, name=semconv.SPAN_LLM_CALL, limit=MAX_PAGE_SIZE, offset=offset)
            )
            for span in page.items:
                counts = by_attempt[span.rollout_id]
                counts[span.attempt_id] = counts.get(span.attempt_id, 0) + 1
                last[span.rollout_id] = span.attempt_id
            offset = page.next_offset
        total += sum(by_attempt[i].get(last[i], 0) for i in chunk if i in last)
    return total / len(rollouts)


def mean_reward(rollouts: Sequence[Rollout]) -> float:
    if not rollouts:
        return 0.0
    return sum(r.reward or 0.0 for r in rollouts) / len(rollouts)
