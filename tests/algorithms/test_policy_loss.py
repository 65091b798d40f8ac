"""policy_loss against numbers worked out by hand: ratios 1.5 and 0.6 around a clip of 0.2."""

from __future__ import annotations

import math

import pytest
import torch

from reinforge.algorithms import GRPO, PPO, kl_penalty, loss_scales, policy_loss
from reinforge.errors import InvalidRequestError
from reinforge.types import Transition

torch.set_num_threads(1)
LOG = math.log


def row(*probs: float) -> torch.Tensor:
    return torch.tensor([[LOG(p) for p in probs]])


BEHAVIOUR = row(0.5, 0.5)
CURRENT = row(0.75, 0.3)  # ratios 1.5 and 0.6
MASK = torch.ones(1, 2)


def test_clipped_objective_with_positive_advantage() -> None:
    logprobs = CURRENT.clone().requires_grad_(True)
    loss, metrics = policy_loss(logprobs, BEHAVIOUR, torch.tensor([1.0]), MASK, GRPO())
    # token 1: max(-1.5, -1.2) = -1.2 (clipped); token 2: max(-0.6, -0.8) = -0.6; token-mean = -0.9
    assert loss.item() == pytest.approx(-0.9)
    assert metrics["clip/frac"] == 0.5 and metrics["clip/frac_high"] == 0.5
    loss.backward()
    # A clipped token has no gradient; the other: d/dlogp (-A·r)/2 = -0.6/2
    assert logprobs.grad[0].tolist() == pytest.approx([0.0, -0.3])
    assert metrics["policy/ratio_mean"] == pytest.approx(1.05)
    assert metrics["policy/ratio_max"] == pytest.approx(1.5)
    # approx KL k3: ((1.5 - 1 - ln 1.5) + (0.6 - 1 - ln 0.6)) / 2
    assert metrics["policy/approx_kl"] == pytest.approx(((0.5 - LOG(1.5)) + (-0.4 - LOG(0.6))) / 2, rel=1e-5)


def test_clipped_objective_with_negative_advantage() -> None:
    loss, metrics = policy_loss(CURRENT, BEHAVIOUR, torch.tensor([-1.0]), MASK, GRPO())
    # token 1: max(1.5, 1.2) = 1.5; token 2: max(0.6, 0.8) = 0.8 (clipped) → 1.15
    assert loss.item() == pytest.approx(1.15)
    assert metrics["clip/frac_low"] == 0.5 and metrics["clip/frac_high"] == 0.0


def test_clip_higher_widens_only_the_upper_side() -> None:
    loss, _ = policy_loss(CURRENT, BEHAVIOUR, torch.tensor([1.0]), MASK, GRPO(clip_eps_high=0.6))
    # ratio 1.5 < 1.6 is no longer clipped: (-1.5 - 0.6) / 2
    assert loss.item() == pytest.approx(-1.05)


def test_truncated_importance_weights_when_the_policy_moved() -> None:
    behaviour = row(0.2, 0.4)
    old = row(0.6, 0.2)  # π_old / π_behaviour = 3 (capped at 2) and 0.5
    loss, metrics = policy_loss(
        old, behaviour, torch.tensor([1.0]), MASK, GRPO(tis_cap=2.0), old_logprobs=old
    )
    # ratio to π_old is 1, so each token is -A · w: (-2 - 0.5) / 2
    assert loss.item() == pytest.approx(-1.25)
    assert metrics["tis/weight_mean"] == pytest.approx(1.25)
    assert metrics["tis/capped_frac"] == 0.5
    assert metrics["policy/behaviour_drift"] == pytest.approx((LOG(3) + LOG(2)) / 2)
    off, metrics = policy_loss(
        old, behaviour, torch.tensor([1.0]), MASK, GRPO(tis_cap=None), old_logprobs=old
    )
    assert off.item() == pytest.approx(-1.0) and "tis/weight_mean" not in metrics


def test_kl_estimators() -> None:
    logprobs, ref = row(0.5), row(0.25)
    assert kl_penalty(logprobs, ref, "k1").item() == pytest.approx(LOG(2))
    # k3 = r - log r - 1 with r = π_ref/π = 0.5: 0.5 + ln 2 - 1
    assert kl_penalty(logprobs, ref, "k3").item() == pytest.approx(0.5 + LOG(2) - 1)


def test_kl_penalty_is_added_to_the_loss() -> None:
    config = GRPO(kl_coef=0.1, kl_estimator="k1")
    mask = torch.ones(1, 1)
    loss, metrics = policy_loss(row(0.5), row(0.5), torch.tensor([1.0]), mask, config, ref_logprobs=row(0.25))
    assert loss.item() == pytest.approx(-1.0 + 0.1 * LOG(2))
    assert metrics["kl/ref"] == pytest.approx(LOG(2))
    assert metrics["loss/policy"] == pytest.approx(-1.0)
    with pytest.raises(InvalidRequestError, match="needs ref_logprobs"):
        policy_loss(row(0.5), row(0.5), torch.tensor([1.0]), mask, config)


# Two rows at ratio 1, so each token's loss is -A: row 0 has 3 tokens with A=1, row 1 one token with A=-2.
ONES = torch.zeros(2, 3)
ADV = torch.tensor([1.0, -2.0])
AGG_MASK = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize(
    ("agg", "expected"),
    [
        ("token-mean", (-3 + 2) / 4),
        ("seq-mean-token-mean", (-1 + 2) / 2),
        ("seq-mean-token-sum", (-3 + 2) / 2),
    ],
)
def test_aggregation_modes_per_transition(agg: str, expected: float) -> None:
    config = GRPO(loss_agg=agg, seq_unit="transition")  # type: ignore[arg-type]
    loss, _ = policy_loss(ONES, ONES, ADV, AGG_MASK, config)
    assert loss.item() == pytest.approx(expected)


def test_masked_positions_never_matter() -> None:
    # Padding may hold anything: huge log-ratios and NaN must not reach the loss or the gradient.
    logprobs = torch.tensor([[0.0, 0.0, 0.0], [0.0, 500.0, float("nan")]], requires_grad=True)
    behaviour = torch.tensor([[0.0, 0.0, 0.0], [0.0, -1e9, 7.0]])
    loss, _ = policy_loss(logprobs, behaviour, ADV, AGG_MASK, GRPO())
    assert loss.item() == pytest.approx(-0.25)
    loss.backward()
    assert torch.isfinite(logprobs.grad).all()


def tr(rollout_id: str, n: int, masked: int = 0) -> Transition:
    return Transition(
        rollout_id=rollout_id,
        attempt_id="a",
        prompt_ids=[1],
        response_ids=[2] * (n + masked),
        response_mask=[1] * n + [0] * masked,
        behaviour_logprobs=[-1.0] * (n + masked),
    )


def test_loss_scales() -> None:
    ts = [tr("r1", 3, masked=2), tr("r1", 1), tr("r2", 2)]
    assert loss_scales(ts, GRPO()) == pytest.approx([1 / 6] * 3)
    per_t = GRPO(loss_agg="seq-mean-token-mean", seq_unit="transition")
    assert loss_scales(ts, per_t) == pytest.approx([1 / 9, 1 / 3, 1 / 6])
    per_r = GRPO(loss_agg="seq-mean-token-mean", seq_unit="rollout")
    assert loss_scales(ts, per_r) == pytest.approx([1 / 8, 1 / 8, 1 / 4])
    assert loss_scales(ts, GRPO(loss_agg="seq-mean-token-sum", seq_unit="transition")) == pytest.approx(
        [1 / 3] * 3
    )
    assert loss_scales(ts, GRPO(loss_agg="seq-mean-token-sum", seq_unit="rollout")) == pytest.approx(
        [1 / 2] * 3
    )
    assert loss_scales([tr("r1", 0)], per_r) == [0.0]


def test_rollout_sequences_need_batch_scales() -> None:
    config = GRPO(loss_agg="seq-mean-token-mean")
    with pytest.raises(InvalidRequestError, match="needs scales=loss_scales"):
        policy_loss(ONES, ONES, ADV, AGG_MASK, config)
    # Both rows in one rollout: one sequence of 4 tokens → (-3 + 2) / 4
    loss, _ = policy_loss(ONES, ONES, ADV, AGG_MASK, config, scales=torch.tensor([0.25, 0.25]))
    assert loss.item() == pytest.approx(-0.25)


def test_micro_batches_add_up_to_the_batch_loss() -> None:
    torch.manual_seed(0)
    ts = [tr("r1", 3), tr("r1", 1), tr("r2", 2), tr("r3", 4)]
    mask = torch.tensor([[1.0] * 3 + [0.0], [1.0] + [0.0] * 3, [1.0] * 2 + [0.0] * 2, [1.0] * 4])
    logprobs, behaviour = -torch.rand(4, 4), -torch.rand(4, 4)
    adv = torch.tensor([1.0, 1.0, -0.5, 0.3])
    for config in (GRPO(), GRPO(loss_agg="seq-mean-token-mean"), PPO(loss_agg="seq-mean-token-sum")):
        scales = torch.tensor(loss_scales(ts, config))
        full, _ = policy_loss(logprobs, behaviour, adv, mask, config, scales=scales)
        parts = sum(
            policy_loss(logprobs[s], behaviour[s], adv[s], mask[s], config, scales=scales[s])[0].item()
            for s in (slice(0, 1), slice(1, 3), slice(3, 4))
        )
        assert parts == pytest.approx(full.item(), rel=1e-6)


def test_entropy_is_reported() -> None:
    entropy = torch.tensor([[1.0, 3.0, 100.0]])
    _, metrics = policy_loss(
        torch.zeros(1, 3),
        torch.zeros(1, 3),
        torch.tensor([1.0]),
        torch.tensor([[1.0, 1.0, 0.0]]),
        GRPO(),
        entropy=entropy,
    )
    assert metrics["policy/entropy"] == pytest.approx(2.0)


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="mask has shape"):
        policy_loss(CURRENT, BEHAVIOUR, torch.tensor([1.0]), torch.ones(1, 3), GRPO())
    with pytest.raises(InvalidRequestError, match="advantages must be"):
        policy_loss(CURRENT, BEHAVIOUR, torch.tensor([1.0, 2.0]), MASK, GRPO())
