from __future__ import annotations

import pytest
import torch

from reinforge.algorithms import PPO, ValueHead, gae, value_loss

torch.set_num_threads(1)


def test_gae_by_hand() -> None:
    # rewards [0, 0, 1], values [0.5, 0.6, 0.7], gamma = 1, λ = 0.5: δ = [0.1, 0.1, 0.3]
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], gamma=1.0, lam=0.5)
    assert advantages == pytest.approx([0.225, 0.25, 0.3])
    assert returns == pytest.approx([0.725, 0.85, 1.0])


def test_gae_with_lambda_one_gives_discounted_monte_carlo_returns() -> None:
    # gamma = 0.9: returns are 0.9², 0.9, 1 whatever the values
    advantages, returns = gae([0.0, 0.0, 1.0], [0.5, 0.6, 0.7], gamma=0.9, lam=1.0)
    assert returns == pytest.approx([0.81, 0.9, 1.0])
    assert advantages == pytest.approx([0.31, 0.3, 0.3])
    with pytest.raises(ValueError, match="2 rewards but 1 values"):
        gae([0.0, 1.0], [0.0], 1.0, 1.0)


def test_value_head_reads_the_chosen_positions_and_starts_at_zero() -> None:
    head = ValueHead(hidden_size=3)
    hidden = torch.arange(2 * 4 * 3, dtype=torch.float32).reshape(2, 4, 3)
    assert head(hidden, torch.tensor([1, 3])).tolist() == [0.0, 0.0]
    with torch.no_grad():
        head.proj.weight.copy_(torch.tensor([[1.0, 0.0, 0.0]]))
        head.proj.bias.fill_(0.5)
    # row 0 position 1 → hidden[0, 1, 0] = 3; row 1 position 3 → hidden[1, 3, 0] = 21
    assert head(hidden, torch.tensor([1, 3])).tolist() == [3.5, 21.5]


def test_clipped_value_loss_by_hand() -> None:
    values = torch.tensor([0.9, 0.0], requires_grad=True)
    returns, old = torch.tensor([1.0, 0.0]), torch.tensor([0.5, 0.0])
    loss, metrics = value_loss(values, returns, PPO(value_clip=0.2), old_values=old)
    # row 0: (0.9 - 1)² = 0.01 vs clipped (0.7 - 1)² = 0.09 → 0.09; row 1: 0 → 0.5 · 0.5 · 0.045
    assert loss.item() == pytest.approx(0.01125)
    assert metrics["value/clip_frac"] == 0.5
    unclipped, _ = value_loss(values, returns, PPO(value_clip=None), old_values=old)
    assert unclipped.item() == pytest.approx(0.5 * 0.5 * 0.005)
    half, _ = value_loss(values, returns, PPO(value_clip=None), scales=torch.tensor([0.25, 0.25]))
    assert half.item() == pytest.approx(0.5 * 0.5 * 0.0025)
