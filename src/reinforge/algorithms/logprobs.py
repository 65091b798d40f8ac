"""Log-probabilities of response tokens under a Hugging Face causal LM, for the loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from reinforge.engine.sampling import sampling_logits


@dataclass
class TokenLogprobs:
    """Tensors aligned with `input_ids` [B, L]; zero wherever `response_mask` is 0."""

    logprobs: torch.Tensor
    entropy: torch.Tensor | None = None
    hidden_states: torch.Tensor | None = None
    """The last layer's hidden states [B, L, H], for a value head (when asked for)."""


def compute_token_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    with_entropy: bool = False,
    with_hidden_states: bool = False,
) -> TokenLogprobs:
    """log π(x_p | x_<p) in float32 at every position p where response_mask is 1.

    π is the distribution the rollouts sample from: the model's logits at `temperature`, truncated
    to `top_k` and `top_p` (`reinforge.engine.sampling.sampling_logits`, the definition the engine
    records behaviour logprobs by), so before the first update the importance ratios are exactly 1.
    The logits at p - 1 predict the token at p. Only the masked-in positions go through the
    log-softmax, which keeps memory at (trained tokens x vocab) rather than (B x L x vocab).
    """
    check_sampling(temperature, top_p, top_k)
    if response_mask[:, 0].any():
        raise ValueError("the first position has no preceding token to predict it from; start with a prompt")
    # Positions count real tokens, so left padding gets the same positions as no padding.
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        output_hidden_states=with_hidden_states,
    )
    targets = response_mask[:, 1:].bool()
    picked, token_entropy = target_logprobs(
        out.logits[:, :-1][targets],
        input_ids[:, 1:][targets],
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        with_entropy=with_entropy,
    )
    logprobs = torch.zeros(input_ids.shape, dtype=torch.float32, device=picked.device)
    logprobs[:, 1:][targets] = picked
    result = TokenLogprobs(logprobs=logprobs)
    if token_entropy is not None:
        entropy = torch.zeros_like(logprobs)
        entropy[:, 1:][targets] = token_entropy
        result.entropy = entropy
    if with_hidden_states:
        result.hidden_states = out.hidden_states[-1]
    return result


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Refuse settings that describe no distribution to recompute."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (greedy decoding has no logprobs to match)")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1]; got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0 (0: no top-k); got {top_k}")


def target_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    *,
    temperature: float,
    top_p: float,
    top_k: int,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Each target's logprob [N] under the sampled distribution of `logits [N, V]`, and (asked for)
    that distribution's entropy [N] (without gradients)."""
    processed = sampling_logits(logits.float(), temperature, top_p, top_k, keep=targets)
    log_norm = torch.logsumexp(processed, dim=-1)
    picked = processed.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - log_norm
    if not with_entropy:
        return picked, None
    with torch.no_grad():
        log_probs = processed - log_norm[:, None]
        probs = log_probs.exp()
        # Tokens outside the top-k/top-p set have probability 0 and add nothing (not 0 * -inf).
        entropy = -torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs)).sum(-1)
    return picked, entropy
