"""Advantage estimators against values computed by hand (written out in each test)."""

from __future__ import annotations

import math

import pytest

from reinforge.algorithms import GRPO, PPO, RLOO, ReinforcePlusPlus, compute_advantages
from reinforge.errors import InvalidRequestError
from reinforge.types import Transition


def tr(rollout_id: str, reward: float, group: str | None = "g", index: int = 0, **kw: object) -> Transition:
    return Transition(
        rollout_id=rollout_id,
        attempt_id=f"a-{rollout_id}",
        group_id=group,
        index=index,
        prompt_ids=[1],
        response_ids=[2, 3],
        response_mask=[1, 1],
        behaviour_logprobs=[-1.0, -1.0],
        reward=reward,
        final_reward=kw.pop("final_reward", reward),  # type: ignore[arg-type]
        reward_sources=kw.pop("sources", {"equal": reward}),  # type: ignore[arg-type]
    )


def advantages(ts: list[Transition]) -> list[float]:
    return [t.advantage for t in ts]  # type: ignore[misc]


def test_grpo_normalises_by_group_mean_and_std() -> None:
    ts = [tr("a", 1.0), tr("b", 0.0), tr("c", 0.0), tr("d", 1.0)]
    result = compute_advantages(ts, GRPO(group_size=4))
    # mean 0.5, sample std sqrt((4 * 0.25) / 3) = 0.5773503 → ±0.5 / 0.5773503 = ±0.8660254
    assert advantages(ts) == pytest.approx([0.8660254, -0.8660254, -0.8660254, 0.8660254], rel=1e-5)
    assert result.metrics["groups"] == 1.0 and result.metrics["groups_flat"] == 0.0
    assert result.metrics["return/mean"] == 0.5


def test_dr_grpo_does_not_divide_by_std() -> None:
    ts = [tr("a", 1.0), tr("b", 0.0), tr("c", 0.0), tr("d", 0.0)]
    compute_advantages(ts, GRPO(group_size=4, scale_by_std=False))
    assert advantages(ts) == pytest.approx([0.75, -0.25, -0.25, -0.25])


def test_group_statistics_are_over_rollouts_not_transitions() -> None:
    # Rollout a made three calls and succeeded, b made one and failed. Over rollouts the mean is 0.5
    # and the std sqrt(0.5); over transitions it would be 0.75, favouring rollouts with many calls.
    ts = [tr("a", 1.0, index=0), tr("a", 1.0, index=1), tr("a", 1.0, index=2), tr("b", 0.0)]
    compute_advantages(ts, GRPO(group_size=2))
    assert advantages(ts) == pytest.approx([0.7071068, 0.7071068, 0.7071068, -0.7071068], rel=1e-5)


def test_grpo_keeps_per_call_credit_differences() -> None:
    # AIR took 0.2 from a's second call: a's value is 0.9, b's 0.0 → baseline 0.45.
    # Spread, each rollout weighing the same: a (0.55² + 0.35²) / 2 = 0.2125, b 0.45² = 0.2025;
    # (0.2125 + 0.2025) / (2 - 1) = 0.415 → std 0.6442049
    ts = [tr("a", 1.0, index=0), tr("a", 0.8, index=1), tr("b", 0.0)]
    compute_advantages(ts, GRPO(group_size=2))
    assert advantages(ts) == pytest.approx([0.55 / 0.6442049, 0.35 / 0.6442049, -0.45 / 0.6442049], rel=1e-5)


def test_a_lone_penalty_in_a_flat_outcome_group_is_not_blown_up() -> None:
    # Eight failed rollouts of three calls; one call made a tool error (-0.2). Baseline mu = -0.2/24.
    # Spread: that rollout ((-0.2 - mu)² + 2 mu²) / 3, each of the other seven mu²; Bessel over 8.
    ts = [tr(f"r{r}", -0.2 if (r, i) == (0, 0) else 0.0, index=i) for r in range(8) for i in range(3)]
    compute_advantages(ts, GRPO(group_size=8))
    mu = -0.2 / 24
    own = ((-0.2 - mu) ** 2 + 2 * mu**2) / 3
    spread = math.sqrt((own + 7 * mu**2) / 7)
    assert ts[0].advantage == pytest.approx((-0.2 - mu) / spread, rel=1e-4)  # std_eps 1e-6 aside
    assert ts[0].advantage == pytest.approx(-4.49, abs=0.01)  # a std over rollout values gives -8.1
    # The advantages' RMS over the group, each rollout weighing the same, is 1 (Bessel: 8/7).
    per_rollout = [sum(t.advantage**2 for t in ts[3 * r : 3 * r + 3]) / 3 for r in range(8)]  # type: ignore[operator]
    assert sum(per_rollout) / 7 == pytest.approx(1.0, rel=1e-4)


def test_grpo_groups_without_signal_and_lone_rollouts_get_zero() -> None:
    ts = [tr("a", 1.0, "g1"), tr("b", 1.0, "g1"), tr("c", 0.0, "g2"), tr("d", 1.0, "g3"), tr("e", 0.0, "g3")]
    result = compute_advantages(ts, GRPO(group_size=2))
    assert advantages(ts)[:3] == [0.0, 0.0, 0.0]
    assert advantages(ts)[3:] == pytest.approx([0.7071068, -0.7071068], rel=1e-5)
    assert result.metrics["groups"] == 3.0
    assert result.metrics["groups_flat"] == 1.0
    assert result.metrics["groups_singleton"] == 1.0


def test_group_algorithms_need_group_ids() -> None:
    with pytest.raises(InvalidRequestError, match="no group_id"):
        compute_advantages([tr("a", 1.0, group=None), tr("b", 0.0, group=None)], GRPO())
    with pytest.raises(InvalidRequestError, match="no group_id"):
        compute_advantages([tr("a", 1.0, group=None)], RLOO())


def test_rloo_uses_the_mean_of_the_other_rollouts() -> None:
    ts = [tr("a", 1.0), tr("b", 0.0), tr("c", 0.0), tr("d", 1.0)]
    compute_advantages(ts, RLOO(group_size=4))
    # a: 1 - (0 + 0 + 1) / 3 = 2/3; b: 0 - (1 + 0 + 1) / 3 = -2/3
    assert advantages(ts) == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def test_reinforce_pp_normalises_over_the_batch() -> None:
    ts = [tr("a", 1.0, None), tr("b", 0.0, None), tr("c", 0.0, None), tr("d", 0.0, None)]
    compute_advantages(ts, ReinforcePlusPlus())
    # mean 0.25, sample std sqrt((0.5625 + 3 * 0.0625) / 3) = 0.5 → 1.5 and -0.5
    assert advantages(ts) == pytest.approx([1.5, -0.5, -0.5, -0.5], rel=1e-5)


def test_reinforce_pp_with_group_baseline() -> None:
    ts = [tr("a", 1.0, "g1"), tr("b", 0.0, "g1"), tr("c", 1.0, "g2"), tr("d", 1.0, "g2")]
    compute_advantages(ts, ReinforcePlusPlus(baseline="group", group_size=2))
    # centred [0.5, -0.5, 0, 0], mean 0, sample std sqrt(0.5 / 3) = 0.4082483
    assert advantages(ts) == pytest.approx([1.2247449, -1.2247449, 0.0, 0.0], rel=1e-5)


def test_ppo_runs_gae_over_each_rollouts_transitions() -> None:
    # Three calls, final reward 1 on the last: rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma=1, λ=0.5:
    # δ = [0.1, 0.1, 0.3]; A2 = 0.3, A1 = 0.1 + 0.5 * 0.3 = 0.25, A0 = 0.1 + 0.5 * 0.25 = 0.225
    ts = [tr("a", 1.0, None, index=i) for i in range(3)]
    result = compute_advantages(ts, PPO(lam=0.5, normalize_advantages=False), values=[0.5, 0.6, 0.7])
    assert advantages(ts) == pytest.approx([0.225, 0.25, 0.3])
    assert result.returns == pytest.approx([0.725, 0.85, 1.0])


def test_ppo_step_rewards_keep_air_where_it_happened() -> None:
    # AIR -0.5 on call 0, final 1 at the end; gamma = λ = 1 and zero values: A_t = sum of rewards from t on.
    ts = [
        tr("a", 0.5, None, index=0, final_reward=1.0, sources={"equal": 1.0, "air": -0.5}),
        tr("a", 1.0, None, index=1, final_reward=1.0, sources={"equal": 1.0, "air": 0.0}),
    ]
    result = compute_advantages(ts, PPO(lam=1.0, normalize_advantages=False), values=[0.0, 0.0])
    assert advantages(ts) == pytest.approx([0.5, 1.0])
    assert result.returns == pytest.approx([0.5, 1.0])


def test_ppo_normalises_advantages_and_checks_its_inputs() -> None:
    ts = [tr("a", 1.0, None), tr("b", 0.0, None)]
    compute_advantages(ts, PPO(), values=[0.0, 0.0])
    assert advantages(ts) == pytest.approx([1 / math.sqrt(2), -1 / math.sqrt(2)], rel=1e-5)
    with pytest.raises(InvalidRequestError, match="one value estimate per transition"):
        compute_advantages(ts, PPO(), values=[0.0])
    with pytest.raises(InvalidRequestError, match="one value estimate per transition"):
        compute_advantages(ts, PPO())
    with pytest.raises(InvalidRequestError, match="uses no value estimates"):
        compute_advantages(ts, RLOO(), values=[0.0, 0.0])
    discounted = [tr("a", 0.5, None, sources={"discounted": 0.5})]
    with pytest.raises(InvalidRequestError, match="own gamma"):
        compute_advantages(discounted, PPO(), values=[0.0])


def test_empty_batch() -> None:
    assert compute_advantages([], GRPO()).metrics == {}


def test_non_finite_rewards_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="non-finite reward"):
        compute_advantages([tr("a", float("nan")), tr("b", 0.0)], GRPO())
