"""Advantage estimators over transitions whose credit credit/ already assigned.

A rollout has one outcome but may have many transitions (one per LLM call). Baselines and
normalisation statistics therefore weigh ROLLOUTS equally, never transitions: a rollout that made
more calls must not weigh more in its group's mean and std. A rollout's value is the mean credit of
its transitions (the final reward under equal credit); the baseline is the mean of those values.
Each transition's advantage is its own credit against that baseline, so AIR penalties and emitted
rewards still reach the call they belong to; the std that divides it is the spread of the credits
with each rollout weighing the same (Bessel-corrected by the number of rollouts), which is the plain
std of the rollout values when credit is equal within rollouts and keeps the advantages' RMS at 1
when a penalty makes one call differ from the rest of its rollout.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from reinforge.algorithms.config import GRPO, PPO, RLOO, Algorithm, ReinforcePlusPlus
from reinforge.algorithms.value import gae
from reinforge.errors import InvalidRequestError
from reinforge.types import Transition

_FLAT_STD = 1e-8
"""Below this, a group's returns count as all equal: its spread is not divided by."""


@dataclass
class AdvantageResult:
    """Metrics for the log, and for PPO the value targets aligned with the transitions given."""

    metrics: dict[str, float] = field(default_factory=dict)
    returns: list[float] | None = None


@dataclass
class _Rollout:
    transitions: list[Transition]
    group_id: str | None

    @property
    def value(self) -> float:
        return sum(t.reward for t in self.transitions) / len(self.transitions)


def compute_advantages(
    transitions: Sequence[Transition],
    algorithm: Algorithm,
    *,
    values: Sequence[float] | None = None,
) -> AdvantageResult:
    """Fill `transition.advantage` for every transition of the batch (in place).

    `values` (PPO only) are the value head's predictions, one per transition, in the order given.
    """
    if not transitions:
        return AdvantageResult()
    bad = next((t for t in transitions if not math.isfinite(t.reward)), None)
    if bad is not None:
        raise InvalidRequestError(f"rollout {bad.rollout_id} has a non-finite reward ({bad.reward})")
    rollouts = _by_rollout(transitions)
    result = AdvantageResult()
    if isinstance(algorithm, PPO):
        result.returns = _ppo(transitions, rollouts, algorithm, values)
    else:
        if values is not None:
            raise InvalidRequestError(
                f"{type(algorithm).__name__} uses no value estimates; pass values only to PPO"
            )
        if isinstance(algorithm, GRPO):
            result.metrics.update(_grpo(rollouts, algorithm))
        elif isinstance(algorithm, RLOO):
            result.metrics.update(_rloo(rollouts))
        elif isinstance(algorithm, ReinforcePlusPlus):
            result.metrics.update(_reinforce_pp(rollouts, algorithm))
        else:
            raise InvalidRequestError(f"unknown algorithm {algorithm!r}")
    advantages = [t.advantage or 0.0 for t in transitions]
    returns = [r.value for r in rollouts.values()]
    result.metrics.update(
        {
            "adv/mean": _mean(advantages),
            "adv/std": _std(advantages),
            "adv/min": min(advantages),
            "adv/max": max(advantages),
            "return/mean": _mean(returns),
            "rollouts": float(len(rollouts)),
            "transitions": float(len(transitions)),
        }
    )
    return result


def _by_rollout(transitions: Sequence[Transition]) -> dict[str, _Rollout]:
    rollouts: dict[str, _Rollout] = {}
    for t in transitions:
        rollouts.setdefault(t.rollout_id, _Rollout([], t.group_id)).transitions.append(t)
    for r in rollouts.values():
        r.transitions.sort(key=lambda t: t.index)
    return rollouts


def _groups(rollouts: dict[str, _Rollout], algorithm_name: str) -> dict[str, list[_Rollout]]:
    groups: dict[str, list[_Rollout]] = {}
    for rollout_id, r in rollouts.items():
        if r.group_id is None:
            raise InvalidRequestError(
                f"{algorithm_name} compares rollouts of the same task, but rollout {rollout_id} has no "
                "group_id; enqueue each task's rollouts with one group_id"
            )
        groups.setdefault(r.group_id, []).append(r)
    return groups


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _std(xs: Sequence[float]) -> float:
    """Sample standard deviation (n - 1), 0.0 for fewer than two values."""
    if len(xs) < 2:
        return 0.0
    m = _mean(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def _spread(rollouts: Sequence[_Rollout], offsets: Sequence[float], centre: float) -> float:
    """Std of (credit - offset) around `centre`, each rollout weighing the same, Bessel-corrected by
    the number of rollouts; 0.0 for fewer than two rollouts."""
    if len(rollouts) < 2:
        return 0.0
    per_rollout = [
        _mean([(t.reward - offset - centre) ** 2 for t in r.transitions])
        for r, offset in zip(rollouts, offsets, strict=True)
    ]
    return math.sqrt(sum(per_rollout) / (len(rollouts) - 1))


def _group_metrics(groups: dict[str, list[_Rollout]]) -> dict[str, float]:
    flat = sum(1 for g in groups.values() if len(g) > 1 and _std([r.value for r in g]) < _FLAT_STD)
    return {
        "groups": float(len(groups)),
        "groups_flat": float(flat),
        "groups_singleton": float(sum(1 for g in groups.values() if len(g) == 1)),
    }


def _grpo(rollouts: dict[str, _Rollout], algorithm: GRPO) -> dict[str, float]:
    groups = _groups(rollouts, "GRPO")
    for group in groups.values():
        values = [r.value for r in group]
        mean = _mean(values)
        # A group whose rollouts all did equally well carries no outcome signal to scale up.
        flat = _std(values) < _FLAT_STD
        std = _spread(group, [0.0] * len(group), mean)
        scale = std + algorithm.std_eps if algorithm.scale_by_std and not flat else 1.0
        for r in group:
            for t in r.transitions:
                # A lone rollout has no baseline to learn from.
                t.advantage = 0.0 if len(group) == 1 else (t.reward - mean) / scale
    return _group_metrics(groups)


def _rloo(rollouts: dict[str, _Rollout]) -> dict[str, float]:
    groups = _groups(rollouts, "RLOO")
    for group in groups.values():
        total = sum(r.value for r in group)
        for r in group:
            baseline = (total - r.value) / (len(group) - 1) if len(group) > 1 else None
            for t in r.transitions:
                t.advantage = 0.0 if baseline is None else t.reward - baseline
    return _group_metrics(groups)


def _reinforce_pp(rollouts: dict[str, _Rollout], algorithm: ReinforcePlusPlus) -> dict[str, float]:
    baselines = {rollout_id: 0.0 for rollout_id in rollouts}
    metrics: dict[str, float] = {}
    if algorithm.baseline == "group":
        groups = _groups(rollouts, "REINFORCE++ with baseline='group'")
        for group in groups.values():
            mean = _mean([r.value for r in group])
            for r in group:
                baselines[r.transitions[0].rollout_id] = mean
        metrics = _group_metrics(groups)
    centred = [r.value - baselines[rid] for rid, r in rollouts.items()]
    mean = _mean(centred)
    std = _spread(list(rollouts.values()), list(baselines.values()), mean)
    scale = std + algorithm.std_eps if _std(centred) >= _FLAT_STD else 1.0
    for rollout_id, r in rollouts.items():
        for t in r.transitions:
            t.advantage = (t.reward - baselines[rollout_id] - mean) / scale
    return metrics


def _ppo(
    transitions: Sequence[Transition],
    rollouts: dict[str, _Rollout],
    algorithm: PPO,
    values: Sequence[float] | None,
) -> list[float]:
    if values is None or len(values) != len(transitions):
        got = "none" if values is None else str(len(values))
        raise InvalidRequestError(
            f"PPO needs one value estimate per transition ({len(transitions)}), got {got}"
        )
    value_of = {id(t): float(v) for t, v in zip(transitions, values, strict=True)}
    return_of: dict[int, float] = {}
    for r in rollouts.values():
        rewards = [_step_reward(t, is_last=i == len(r.transitions) - 1) for i, t in enumerate(r.transitions)]
        advantages, returns = gae(
            rewards, [value_of[id(t)] for t in r.transitions], algorithm.gamma, algorithm.lam
        )
        for t, advantage, ret in zip(r.transitions, advantages, returns, strict=True):
            t.advantage = advantage
            return_of[id(t)] = ret
    if algorithm.normalize_advantages:
        raw = [t.advantage or 0.0 for t in transitions]
        mean, std = _mean(raw), _std(raw)
        scale = std + 1e-6 if std >= _FLAT_STD else 1.0
        for t in transitions:
            t.advantage = ((t.advantage or 0.0) - mean) / scale
    return [return_of[id(t)] for t in transitions]


def _step_reward(t: Transition, *, is_last: bool) -> float:
    """PPO's per-step reward: what happened at this call, plus the outcome at the end."""
    if "discounted" in t.reward_sources:
        raise InvalidRequestError(
            "PPO discounts with its own gamma; use credit 'equal' (optionally with emitted/air), "
            "not 'discounted'"
        )
    step = t.reward_sources.get("emitted", 0.0) + t.reward_sources.get("air", 0.0)
    if is_last and ("equal" in t.reward_sources or not t.reward_sources):
        step += t.final_reward
    return step
