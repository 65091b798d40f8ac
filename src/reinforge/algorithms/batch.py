"""Transitions → padded token tensors in the layout `compute_token_logprobs` and `policy_loss` use.

Each row is prompt + response, right-padded; per-token tensors are aligned with `input_ids`, so the
behaviour logprob of the token at position p sits at [row, p] and prompt/padding positions are 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from reinforge.types import Transition


@dataclass
class TokenBatch:
    input_ids: torch.Tensor
    """[B, L] long."""
    attention_mask: torch.Tensor
    """[B, L] long: 1 on prompt and response tokens."""
    response_mask: torch.Tensor
    """[B, L] float: 1 on trained response tokens only."""
    behaviour_logprobs: torch.Tensor
    """[B, L] float32."""
    advantages: torch.Tensor
    """[B] float32 (0.0 where a transition has none yet)."""
    prompt_lengths: torch.Tensor
    """[B] long; prompt_lengths - 1 is the last prompt token, where a value head reads the state."""

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(**{name: value.to(device) for name, value in vars(self).items()})


def collate_transitions(transitions: Sequence[Transition], pad_token_id: int) -> TokenBatch:
    """Pad a micro-batch of transitions into tensors."""
    if not transitions:
        raise ValueError("collate_transitions needs at least one transition")
    width = max(len(t.prompt_ids) + len(t.response_ids) for t in transitions)
    rows = len(transitions)
    input_ids = torch.full((rows, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((rows, width), dtype=torch.long)
    response_mask = torch.zeros((rows, width), dtype=torch.float32)
    behaviour = torch.zeros((rows, width), dtype=torch.float32)
    for row, t in enumerate(transitions):
        if not len(t.response_ids) == len(t.response_mask) == len(t.behaviour_logprobs):
            raise ValueError(
                f"transition {row}: response_ids, response_mask and behaviour_logprobs differ in length"
            )
        start, end = len(t.prompt_ids), len(t.prompt_ids) + len(t.response_ids)
        input_ids[row, :end] = torch.tensor(t.prompt_ids + t.response_ids, dtype=torch.long)
        attention_mask[row, :end] = 1
        response_mask[row, start:end] = torch.tensor(t.response_mask, dtype=torch.float32)
        behaviour[row, start:end] = torch.tensor(t.behaviour_logprobs, dtype=torch.float32)
    return TokenBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        behaviour_logprobs=behaviour * response_mask,
        advantages=torch.tensor([t.advantage or 0.0 for t in transitions], dtype=torch.float32),
        prompt_lengths=torch.tensor([len(t.prompt_ids) for t in transitions], dtype=torch.long),
    )
