"""Log-probabilities of response tokens under a Hugging Face causal LM, for the loss."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


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
    with_entropy: bool = False,
    with_hidden_states: bool = False,
) -> TokenLogprobs:
    """log π(x_p | x_<p) in float32 at every position p where response_mask is 1.

    The logits at p - 1 predict the token at p. Only the masked-in positions go through the
    log-softmax, which keeps memory at (trained tokens x vocab) rather than (B x L x vocab).
    `temperature` must match the sampler's when behaviour logprobs were recorded at that
    temperature, or the importance ratio is off from the first step.
    """
    if temperature <= 0:
        raise ValueError("temperature must be > 0 (greedy decoding has no logprobs to match)")
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
    logits = out.logits[:, :-1][targets].float() / temperature  # [N, V]
    log_norm = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, input_ids[:, 1:][targets].unsqueeze(-1)).squeeze(-1) - log_norm

    logprobs = torch.zeros(input_ids.shape, dtype=torch.float32, device=logits.device)
    logprobs[:, 1:][targets] = picked
    result = TokenLogprobs(logprobs=logprobs)
    if with_entropy:
        with torch.no_grad():
            probs = torch.softmax(logits, dim=-1)
            token_entropy = log_norm - (probs * logits).sum(-1)
        entropy = torch.zeros_like(logprobs)
        entropy[:, 1:][targets] = token_entropy
        result.entropy = entropy
    if with_hidden_states:
        result.hidden_states = out.hidden_states[-1]
    return result
