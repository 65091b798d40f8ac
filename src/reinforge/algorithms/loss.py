"""The clipped policy-gradient loss with truncated importance weights, clip-higher and KL.

Aggregation is expressed as one scale per row (`loss_scales`): the loss is Σ scale_i · Σ_t mask_it ·
l_it. Computing the scales once over the whole batch makes micro-batches add up to exactly the
batch's loss, which per-micro-batch means would not.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from reinforge.algorithms.config import PolicyLossConfig
from reinforge.errors import InvalidRequestError
from reinforge.types import Transition

_MAX_LOG_RATIO = 20.0
"""exp() of a larger log-ratio overflows float32 on the way to being clipped anyway."""


def loss_scales(transitions: Sequence[Transition], config: PolicyLossConfig) -> list[float]:
    """The weight of each transition's summed token losses, so the batch aggregates as configured.

    token-mean: 1/N (N trained tokens in the batch). With seq_unit "transition": seq-mean-token-mean
    1/(S·n_i), seq-mean-token-sum 1/S (S sequences, n_i tokens in transition i). With seq_unit
    "rollout" a sequence is a rollout's transitions taken together: 1/(R·n_r) and 1/R.
    """
    tokens = [sum(t.response_mask) for t in transitions]
    if config.loss_agg == "token-mean":
        total = sum(tokens)
        return [1.0 / total if total and n else 0.0 for n in tokens]
    if config.seq_unit == "transition":
        keys = [str(i) for i in range(len(transitions))]
    else:
        keys = [t.rollout_id for t in transitions]
    per_key: dict[str, int] = {}
    for key, n in zip(keys, tokens, strict=True):
        per_key[key] = per_key.get(key, 0) + n
    sequences = sum(1 for n in per_key.values() if n)
    if config.loss_agg == "seq-mean-token-sum":
        return [1.0 / sequences if n else 0.0 for n in tokens]
    return [1.0 / (sequences * per_key[key]) if n else 0.0 for key, n in zip(keys, tokens, strict=True)]


def _batch_scales(mask: torch.Tensor, config: PolicyLossConfig) -> torch.Tensor:
    """Scales for when each row is its own sequence and the rows given are the whole batch."""
    tokens = mask.sum(dim=-1)
    sequences = (tokens > 0).sum().clamp(min=1)
    if config.loss_agg == "token-mean":
        return torch.full_like(tokens, 1.0) / tokens.sum().clamp(min=1)
    if config.loss_agg == "seq-mean-token-sum":
        return (tokens > 0).to(tokens.dtype) / sequences
    return torch.where(tokens > 0, 1.0 / (sequences * tokens.clamp(min=1)), torch.zeros_like(tokens))


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token KL(π ‖ π_ref) estimate from sampled tokens: k1 = log π/π_ref, k3 = r - log r - 1 with
    r = π_ref/π (unbiased and never negative; clamped against outliers)."""
    log_ratio = logprobs - ref_logprobs
    if estimator == "k1":
        return log_ratio
    return (torch.exp(-log_ratio) + log_ratio - 1.0).clamp(max=10.0)


def policy_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    config: PolicyLossConfig,
    old_logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    *,
    scales: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The clipped policy-gradient loss over [B, T] token tensors; returns (loss, metrics).

    The PPO ratio is π/π_old with `old_logprobs` (the trainer's own logprobs before the update), else
    π/π_behaviour. With `old_logprobs` and `config.tis_cap`, each token's loss is also weighted by
    min(π_old/π_behaviour, C): the engine's sampler and the trainer disagree a little, or a lot when
    the policy moved since the tokens were generated. `advantages` is [B] or [B, T]; `scales` [B]
    comes from `loss_scales` over the whole batch (needed for micro-batching and for
    seq_unit="rollout"); `entropy` [B, T] is reported, not optimised.
    """
    shapes = {
        "behaviour_logprobs": behaviour_logprobs,
        "mask": mask,
        "old_logprobs": old_logprobs,
        "ref_logprobs": ref_logprobs,
        "entropy": entropy,
    }
    for name, tensor in shapes.items():
        if tensor is not None and tensor.shape != logprobs.shape:
            raise InvalidRequestError(
                f"{name} has shape {tuple(tensor.shape)}, logprobs {tuple(logprobs.shape)}"
            )
    if advantages.shape not in ((logprobs.shape[0],), logprobs.shape):
        raise InvalidRequestError(f"advantages must be [B] or [B, T]; got {tuple(advantages.shape)}")
    mask = mask.to(logprobs.dtype)
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(-1)
    advantages = advantages.to(logprobs.dtype)
    if scales is None:
        if config.seq_unit == "rollout" and config.loss_agg != "token-mean":
            raise InvalidRequestError(
                f"loss_agg={config.loss_agg!r} with seq_unit='rollout' needs scales=loss_scales(transitions, "
                "config): the rows alone don't say which rollout they belong to"
            )
        scales = _batch_scales(mask, config)
    weights = mask * scales.to(logprobs.dtype).unsqueeze(-1)
    if config.kl_coef > 0 and ref_logprobs is None:
        raise InvalidRequestError("kl_coef > 0 needs ref_logprobs from the reference policy")

    base = (old_logprobs if old_logprobs is not None else behaviour_logprobs).detach()
    # Masked positions may hold anything (padding); zero them before exp so they can't overflow.
    log_ratio = torch.where(mask > 0, logprobs - base, torch.zeros_like(logprobs)).clamp(
        -_MAX_LOG_RATIO, _MAX_LOG_RATIO
    )
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - config.clip_eps_low, 1.0 + config.eps_high)
    per_token = torch.maximum(unclipped, clipped)

    metrics: dict[str, float] = {}
    if old_logprobs is not None and config.tis_cap is not None:
        drift = torch.where(mask > 0, old_logprobs - behaviour_logprobs, torch.zeros_like(logprobs)).detach()
        raw = torch.exp(drift.clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO))
        is_weight = raw.clamp(max=config.tis_cap)
        per_token = per_token * is_weight
        metrics["tis/weight_mean"] = _masked_mean(is_weight, mask)
        metrics["tis/capped_frac"] = _masked_mean((raw > config.tis_cap).to(mask.dtype), mask)
    if old_logprobs is not None:
        gap = torch.where(mask > 0, (old_logprobs - behaviour_logprobs).abs(), torch.zeros_like(logprobs))
        metrics["policy/behaviour_drift"] = _masked_mean(gap, mask)
        metrics["policy/behaviour_drift_max"] = float(gap.detach().max()) if gap.numel() else 0.0

    pg_loss = (per_token * weights).sum()
    loss = pg_loss
    if ref_logprobs is not None:
        kl = kl_penalty(logprobs, ref_logprobs.detach(), config.kl_estimator)
        kl_loss = (kl * weights).sum()
        metrics["kl/ref"] = _masked_mean(kl, mask)
        if config.kl_coef > 0:
            loss = loss + config.kl_coef * kl_loss

    with torch.no_grad():
        low = (ratio < 1.0 - config.clip_eps_low) & (advantages < 0)
        high = (ratio > 1.0 + config.eps_high) & (advantages > 0)
        metrics.update(
            {
                "loss/policy": pg_loss.item(),
                "loss/total": loss.item(),
                "clip/frac": _masked_mean((low | high).to(mask.dtype), mask),
                "clip/frac_low": _masked_mean(low.to(mask.dtype), mask),
                "clip/frac_high": _masked_mean(high.to(mask.dtype), mask),
                "policy/approx_kl": _masked_mean(ratio - 1.0 - log_ratio, mask),
                "policy/ratio_mean": _masked_mean(ratio, mask),
                "policy/ratio_max": ratio[mask > 0].max().item() if bool((mask > 0).any()) else 1.0,
                "tokens": mask.sum().item(),
            }
        )
        if entropy is not None:
            metrics["policy/entropy"] = _masked_mean(entropy, mask)
    return loss, metrics


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    count = mask.sum()
    if count.item() == 0:
        return 0.0
    return ((values.detach() * mask).sum() / count).item()
