"""The distribution a request samples from, written with Hugging Face's own logits warpers: the
independent reference that the engine, the fake vLLM/SGLang servers and the trainer are checked
against (temperature, then top-k, then top-p over the top-k renormalised, as `generate` applies them)."""

from __future__ import annotations

import torch
from transformers.generation.logits_process import (
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def processed_logprobs(
    logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0
) -> torch.Tensor:
    """log-probabilities [n, vocab] of the distribution sampled from at each row of `logits`; at
    temperature 0 (greedy) the untruncated distribution at temperature 1, as vLLM and SGLang report."""
    scores = logits.float().clone()
    if temperature > 0:
        scores = TemperatureLogitsWarper(temperature)(None, scores)  # type: ignore[arg-type]
        if top_k > 0:
            scores = TopKLogitsWarper(top_k)(None, scores)  # type: ignore[arg-type]
        if top_p < 1.0:
            scores = TopPLogitsWarper(top_p)(None, scores)  # type: ignore[arg-type]
    return torch.log_softmax(scores, dim=-1)


def sglang_logprobs(logits: torch.Tensor, temperature: float, top_p: float = 1.0) -> torch.Tensor:
    """What SGLang returns by default (SGLANG_RETURN_ORIGINAL_LOGPROB unset): the probabilities at
    the temperature renormalised over the top-p set (its `top_p_normalize_probs_torch`), top-k left
    out; greedy: the raw log-softmax."""
    if temperature <= 0:
        return torch.log_softmax(logits.float(), dim=-1)
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_probs[mass_before > top_p] = 0.0
    renormed = sorted_probs / sorted_probs.sum(dim=-1, keepdim=True)
    return torch.log(torch.zeros_like(probs).scatter(-1, order, renormed))
