"""Advantages and losses against the published formulas, written out here independently of
`reinforge.algorithms` (NumPy, float64, one line per formula), on fixed numbers, within 1e-6.

- GRPO (Shao et al. 2024): A_i = (r_i - mean(r_g)) / (std(r_g) + eps), std the sample std;
  Dr. GRPO (Liu et al. 2025) drops the division.
- RLOO (Ahmadian et al. 2024): A_i = r_i - mean_{j != i} r_j.
- REINFORCE++ (Hu 2025): A = (r - mean(r)) / (std(r) + eps) over the batch; "-baseline" subtracts
  the group mean first.
- PPO (Schulman et al. 2017) with GAE (2016): delta_t = r_t + gamma V_{t+1} - V_t,
  A_t = sum_l (gamma lambda)^l delta_{t+l}, returns A + V, advantages normalised over the batch; value
  loss 0.5 max((V - R)^2, (V_old + clip(V - V_old, +-c) - R)^2).
- The clipped surrogate: l = -min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A) with rho = pi/pi_old,
  DAPO's clip-higher (Yu et al. 2025) when eps_high > eps_low, weighted by truncated importance
  sampling min(pi_old/pi_behaviour, C); aggregated token-mean (DAPO) or seq-mean-token-mean (GRPO).

`benchmarks/trl_parity.py` puts these same fixtures through TRL's own GRPO and RLOO trainer code
(docs/algorithms.md, "Against TRL's own code").
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reinforge.algorithms import GRPO, PPO, RLOO, ReinforcePlusPlus, compute_advantages, policy_loss
from reinforge.algorithms.config import PolicyLossConfig
from reinforge.algorithms.value import value_loss
from reinforge.types import Transition

REWARDS = [[1.0, 0.0, 0.0, 1.0, 1.0], [0.2, 0.9, 0.4, 0.4, 0.1], [1.0, 1.0, 1.0, 1.0, 1.0]]
"""Three groups of five rollouts: binary, graded, and flat (no signal)."""


def outcome_batch() -> list[Transition]:
    return [
        Transition(
            rollout_id=f"g{g}-{i}",
            attempt_id=f"a{g}-{i}",
            group_id=f"g{g}",
            prompt_ids=[1],
            response_ids=[2],
            response_mask=[1],
            behaviour_logprobs=[0.0],
            reward=r,
            final_reward=r,
        )
        for g, group in enumerate(REWARDS)
        for i, r in enumerate(group)
    ]


def advantages_of(algorithm: GRPO | RLOO | ReinforcePlusPlus) -> list[float]:
    batch = outcome_batch()
    compute_advantages(batch, algorithm)
    return [float(t.advantage or 0.0) for t in batch]


def test_grpo_advantages_are_the_group_z_scores() -> None:
    eps = 1e-6
    expected = np.concatenate(
        [(np.array(g) - np.mean(g)) / (np.std(g, ddof=1) + eps) for g in REWARDS[:2]] + [np.zeros(5)]
    )
    assert advantages_of(GRPO(group_size=5, std_eps=eps)) == pytest.approx(expected.tolist(), abs=1e-6)
    dr_grpo = np.concatenate([np.array(g) - np.mean(g) for g in REWARDS])
    assert advantages_of(GRPO(group_size=5, scale_by_std=False)) == pytest.approx(dr_grpo.tolist(), abs=1e-6)


def test_rloo_advantages_leave_one_out() -> None:
    expected = [r - (np.sum(g) - r) / (len(g) - 1) for g in REWARDS for r in g]
    assert advantages_of(RLOO(group_size=5)) == pytest.approx(expected, abs=1e-6)


def test_reinforce_pp_advantages_are_batch_normalised() -> None:
    eps = 1e-6
    r = np.array(REWARDS).ravel()
    plain = (r - r.mean()) / (r.std(ddof=1) + eps)
    assert advantages_of(ReinforcePlusPlus(std_eps=eps)) == pytest.approx(plain.tolist(), abs=1e-6)
    centred = np.concatenate([np.array(g) - np.mean(g) for g in REWARDS])
    baseline = (centred - centred.mean()) / (centred.std(ddof=1) + eps)
    got = advantages_of(ReinforcePlusPlus(group_size=5, baseline="group", std_eps=eps))
    assert got == pytest.approx(baseline.tolist(), abs=1e-6)


def test_ppo_advantages_are_normalised_gae_and_the_value_loss_is_clipped() -> None:
    gamma, lam = 0.9, 0.8
    # Two rollouts of 3 and 2 calls: emitted rewards along the way, the outcome at the end.
    steps = {"r0": [0.1, 0.0, 1.0], "r1": [-0.2, 0.5]}
    values = {"r0": [0.3, 0.5, 0.7], "r1": [0.1, 0.2]}
    batch = []
    for rid, rewards in steps.items():
        for i, step in enumerate(rewards):
            last = i == len(rewards) - 1
            sources = {"equal": 0.0, "emitted": 0.0 if last else step}
            batch.append(
                Transition(
                    rollout_id=rid,
                    attempt_id=rid,
                    index=i,
                    prompt_ids=[1],
                    response_ids=[2],
                    response_mask=[1],
                    behaviour_logprobs=[0.0],
                    reward_sources=sources,
                    final_reward=step if last else 0.0,
                )
            )
    config = PPO(gamma=gamma, lam=lam, value_clip=0.2, vf_coef=0.5)
    flat_values = [v for rid in steps for v in values[rid]]
    result = compute_advantages(batch, config, values=flat_values)
    raw, returns = [], []
    for rid, r in steps.items():
        v = values[rid] + [0.0]
        deltas = [r[t] + gamma * v[t + 1] - v[t] for t in range(len(r))]
        adv = [sum((gamma * lam) ** k * deltas[t + k] for k in range(len(r) - t)) for t in range(len(r))]
        raw += adv
        returns += [a + value for a, value in zip(adv, values[rid], strict=True)]
    raw_np = np.array(raw)
    normalised = (raw_np - raw_np.mean()) / (raw_np.std(ddof=1) + 1e-6)
    assert [t.advantage for t in batch] == pytest.approx(normalised.tolist(), abs=1e-6)
    assert result.returns == pytest.approx(returns, abs=1e-6)

    new = np.array([0.6, 0.1, 0.75, 0.45, 0.2])
    old = np.array(flat_values)
    target = np.array(returns)
    clipped = old + np.clip(new - old, -0.2, 0.2)
    expected = 0.5 * 0.5 * np.mean(np.maximum((new - target) ** 2, (clipped - target) ** 2))
    loss, _ = value_loss(
        torch.tensor(new), torch.tensor(target), config, old_values=torch.tensor(old, dtype=torch.float64)
    )
    assert float(loss) == pytest.approx(float(expected), abs=1e-6)


# Three sequences of different lengths (mask 0 = padding or context), fixed log-probabilities.
MASK = np.array([[1, 1, 1, 1, 0, 0], [0, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=np.float64)
LOGPROBS = np.array(
    [
        [-0.5, -1.2, -0.1, -2.0, 0.0, 0.0],
        [0.0, -0.7, -0.4, 0.0, 0.0, 0.0],
        [-1.0, -0.2, -0.9, -0.05, -3.0, -0.6],
    ]
)
OLD = LOGPROBS + np.array(
    [[0.3, -0.1, 0.05, -0.4, 0.0, 0.0], [0.0, 0.25, -0.3, 0.0, 0.0, 0.0], [-0.2, 0.02, 0.5, -0.1, 0.35, 0.0]]
)
BEHAVIOUR = OLD + np.array(
    [[0.0, 0.1, -0.9, 0.0, 0.0, 0.0], [0.0, -0.05, 0.2, 0.0, 0.0, 0.0], [0.4, 0.0, 0.0, -0.3, 0.0, 0.1]]
)
ADVANTAGES = np.array([1.5, -0.8, 0.4])


def reference_loss(config: PolicyLossConfig, logprobs: np.ndarray) -> float:
    rho = np.exp(logprobs - OLD)
    a = ADVANTAGES[:, None]
    surrogate = -np.minimum(rho * a, np.clip(rho, 1 - config.clip_eps_low, 1 + config.eps_high) * a)
    assert config.tis_cap is not None
    tis = np.minimum(np.exp(OLD - BEHAVIOUR), config.tis_cap)
    per_token = surrogate * tis * MASK
    if config.loss_agg == "token-mean":
        return float(per_token.sum() / MASK.sum())
    assert config.loss_agg == "seq-mean-token-mean"
    return float(np.mean(per_token.sum(axis=1) / MASK.sum(axis=1)))


def reference_gradient(config: PolicyLossConfig, step: float = 1e-6) -> np.ndarray:
    """d loss / d logprobs by central differences of the reference loss."""
    grad = np.zeros_like(LOGPROBS)
    for index in np.ndindex(LOGPROBS.shape):
        up, down = LOGPROBS.copy(), LOGPROBS.copy()
        up[index] += step
        down[index] -= step
        grad[index] = (reference_loss(config, up) - reference_loss(config, down)) / (2 * step)
    return grad


@pytest.mark.parametrize(
    "config",
    [
        GRPO(group_size=3, loss_agg="token-mean", seq_unit="transition"),
        GRPO(group_size=3, loss_agg="seq-mean-token-mean", seq_unit="transition"),
        GRPO(group_size=3, clip_eps_low=0.2, clip_eps_high=0.28, seq_unit="transition"),  # DAPO
        RLOO(group_size=3, loss_agg="seq-mean-token-mean", seq_unit="transition"),
        ReinforcePlusPlus(clip_eps_low=0.1, tis_cap=1.5, seq_unit="transition"),
        PPO(clip_eps_low=0.2, seq_unit="transition"),
    ],
    ids=["grpo-token-mean", "grpo-seq-mean-token-mean", "dapo-clip-higher", "rloo", "reinforce-pp", "ppo"],
)
def test_the_clipped_surrogate_loss_and_its_gradient_match_the_formula(config: PolicyLossConfig) -> None:
    logprobs = torch.tensor(LOGPROBS, requires_grad=True)
    loss, metrics = policy_loss(
        logprobs,
        torch.tensor(BEHAVIOUR),
        torch.tensor(ADVANTAGES),
        torch.tensor(MASK),
        config,
        old_logprobs=torch.tensor(OLD),
    )
    assert float(loss.detach()) == pytest.approx(reference_loss(config, LOGPROBS), abs=1e-6)
    loss.backward()
    assert logprobs.grad is not None
    np.testing.assert_allclose(logprobs.grad.numpy(), reference_gradient(config), atol=1e-6)
    # Some tokens are clipped on each side, so the clip range is what is being checked.
    assert metrics["clip/frac"] > 0
