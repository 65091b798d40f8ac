"""PPO's critic: a value head on the policy's hidden states, GAE over a rollout's transitions, and
the clipped value loss."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from reinforge.algorithms.config import PPO


class ValueHead(nn.Module):
    """A linear value estimate read from the policy's last hidden state at chosen positions.

    It starts at exactly zero (zero weights) so the first advantages are plain returns instead of
    noise from a random head.
    """

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden_states: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """hidden_states [B, T, H], positions [B] (e.g. each row's last prompt token) → values [B]."""
        rows = torch.arange(hidden_states.shape[0], device=hidden_states.device)
        picked = hidden_states[rows, positions.to(hidden_states.device)]
        return self.proj(picked.float()).squeeze(-1)


def gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """Generalised advantage estimation over one trajectory that ends after its last step.

    delta_t = r_t + gamma V_{t+1} - V_t (V after the end is 0), A_t = delta_t + gamma lam A_{t+1};
    returns are A_t + V_t (the value targets).
    """
    if len(rewards) != len(values):
        raise ValueError(f"{len(rewards)} rewards but {len(values)} values")
    advantages = [0.0] * len(rewards)
    running = 0.0
    for t in reversed(range(len(rewards))):
        next_value = values[t + 1] if t + 1 < len(values) else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        advantages[t] = running
    return advantages, [a + v for a, v in zip(advantages, values, strict=True)]


def value_loss(
    values: torch.Tensor,
    returns: torch.Tensor,
    config: PPO,
    old_values: torch.Tensor | None = None,
    scales: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """0.5 · max((V - R)², (clip(V, V_old ± c) - R)²), averaged over transitions.

    `scales` (one per row, summing to 1 over the full batch) lets micro-batches add up to the batch
    mean; without it the rows given are averaged. The result is already multiplied by `vf_coef`.
    """
    values, returns = values.float(), returns.float().to(values.device)
    error = (values - returns) ** 2
    clip_frac = 0.0
    if config.value_clip is not None and old_values is not None:
        old = old_values.float().to(values.device)
        clipped = old + (values - old).clamp(-config.value_clip, config.value_clip)
        clipped_error = (clipped - returns) ** 2
        clip_frac = (clipped_error > error).float().mean().item()
        error = torch.maximum(error, clipped_error)
    weights = (
        scales.float().to(values.device) if scales is not None else torch.full_like(values, 1 / len(values))
    )
    loss = config.vf_coef * 0.5 * (error * weights).sum()
    return loss, {
        "value/loss": loss.item(),
        "value/mean": values.mean().item(),
        "value/error": error.mean().item(),
        "value/clip_frac": clip_frac,
    }
