"""Properties of the estimators and loss weights over random batches."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reinforge.algorithms import GRPO, RLOO, ReinforcePlusPlus, compute_advantages, loss_scales
from reinforge.types import Transition

# A batch: groups of rollouts, each rollout (reward, number of transitions, trained tokens per transition).
rollout_st = st.tuples(
    st.sampled_from([0.0, 0.5, 1.0]), st.lists(st.integers(min_value=0, max_value=5), min_size=1, max_size=4)
)
batch_st = st.lists(st.lists(rollout_st, min_size=2, max_size=6), min_size=1, max_size=4)


def make(batch: list[list[tuple[float, list[int]]]], shift: float = 0.0) -> list[Transition]:
    out = []
    for g, group in enumerate(batch):
        for r, (reward, lengths) in enumerate(group):
            for i, n in enumerate(lengths):
                out.append(
                    Transition(
                        rollout_id=f"g{g}r{r}",
                        attempt_id="a",
                        group_id=f"g{g}",
                        index=i,
                        prompt_ids=[1],
                        response_ids=[2] * (n + 1),
                        response_mask=[1] * n + [0],
                        behaviour_logprobs=[-1.0] * (n + 1),
                        reward=reward + shift,
                    )
                )
    return out


def per_rollout(transitions: list[Transition]) -> dict[str, float]:
    return {t.rollout_id: t.advantage for t in transitions}  # type: ignore[misc]


@settings(max_examples=80, deadline=None)
@given(batch=batch_st)
def test_group_advantages_sum_to_zero_per_group_whatever_the_number_of_calls(batch: list) -> None:
    for algorithm in (GRPO(), GRPO(scale_by_std=False), RLOO()):
        transitions = make(batch)
        compute_advantages(transitions, algorithm)
        advantages = per_rollout(transitions)
        for g, group in enumerate(batch):
            assert sum(advantages[f"g{g}r{r}"] for r in range(len(group))) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(batch=batch_st, shift=st.floats(min_value=-5, max_value=5))
def test_advantages_ignore_a_constant_reward_shift(batch: list, shift: float) -> None:
    for algorithm in (GRPO(), RLOO(), ReinforcePlusPlus()):
        base, shifted = make(batch), make(batch, shift)
        compute_advantages(base, algorithm)
        compute_advantages(shifted, algorithm)
        assert [t.advantage for t in shifted] == pytest.approx([t.advantage for t in base], abs=1e-6)


@settings(max_examples=80, deadline=None)
@given(batch=batch_st)
def test_rloo_is_grpo_without_std_scaled_by_n_over_n_minus_one(batch: list) -> None:
    rloo, dr_grpo = make(batch), make(batch)
    compute_advantages(rloo, RLOO())
    compute_advantages(dr_grpo, GRPO(scale_by_std=False))
    sizes = {f"g{g}": len(group) for g, group in enumerate(batch)}
    for a, b in zip(rloo, dr_grpo, strict=True):
        n = sizes[a.group_id or ""]
        assert a.advantage == pytest.approx(b.advantage * n / (n - 1), abs=1e-9)  # type: ignore[operator]


@settings(max_examples=80, deadline=None)
@given(batch=batch_st)
def test_loss_weights_sum_to_one_and_rollouts_weigh_equally(batch: list) -> None:
    transitions = make(batch)
    tokens = [sum(t.response_mask) for t in transitions]
    if not any(tokens):
        return
    for agg in ("token-mean", "seq-mean-token-mean"):
        for unit in ("rollout", "transition"):
            config = GRPO(loss_agg=agg, seq_unit=unit)  # type: ignore[arg-type]
            scales = loss_scales(transitions, config)
            assert sum(s * n for s, n in zip(scales, tokens, strict=True)) == pytest.approx(1.0)
    weight: dict[str, float] = {}
    config = GRPO(loss_agg="seq-mean-token-mean", seq_unit="rollout")
    for t, s, n in zip(transitions, loss_scales(transitions, config), tokens, strict=True):
        weight[t.rollout_id] = weight.get(t.rollout_id, 0.0) + s * n
    nonzero = [w for w in weight.values() if w > 0]
    assert nonzero == pytest.approx([1 / len(nonzero)] * len(nonzero))
