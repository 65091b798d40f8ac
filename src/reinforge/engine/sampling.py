"""Batched sampling with per-request parameters and per-request seeds.

The returned logprob of a chosen token is `log_softmax(raw logits)[token]`: the model's own
distribution at temperature 1, before temperature, top-k, top-p, penalties, logit bias or a grammar.
That is the policy's probability pi(token | context), the quantity the trainer recomputes with a plain
forward pass, so the two agree exactly and importance ratios compare like with like. (The distribution
actually sampled from, after temperature, truncation and shaping, is a behaviour-policy detail the
trainer corrects for via these logprobs.)

Sampling uses the exponential race: `argmax(p / E)` with `E ~ Exp(1)` draws from `p`, so one argmax
samples every row at once; seeded requests draw their row of noise from their own generator, which
makes a seeded response independent of what else is in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from reinforge.engine.logit_shaping import LogitShaper


@dataclass(frozen=True)
class RowParams:
    temperature: float
    top_p: float
    top_k: int
    generator: torch.Generator | None
    shaper: LogitShaper | None = None
    """Penalties, bias or a grammar: they change what is sampled, never the recorded logprob."""


def sample(
    logits: torch.Tensor, rows: list[RowParams], shared: torch.Generator
) -> tuple[list[int], list[float]]:
    """Choose one token per row of float32 `logits [n, vocab]`; return tokens and their logprobs."""
    logprobs_all = torch.log_softmax(logits, dim=-1)
    shaped = [i for i, r in enumerate(rows) if r.shaper is not None]
    if shaped:
        logits = logits.clone()
        for i in shaped:
            shaper = rows[i].shaper
            assert shaper is not None
            shaper.shape(logits[i])
    chosen = torch.argmax(logits, dim=-1)
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    if sampled:
        idx = torch.tensor(sampled, device=logits.device)
        sub = logits.index_select(0, idx)
        temps = torch.tensor([rows[i].temperature for i in sampled], device=logits.device, dtype=sub.dtype)
        probs = torch.softmax(sub / temps[:, None], dim=-1)
        probs = _truncate(probs, [rows[i] for i in sampled])
        noise = torch.empty_like(probs)
        unseeded = [j for j, i in enumerate(sampled) if rows[i].generator is None]
        if unseeded:
            # The CPU generator draws on CPU; noise is moved to the logits' device.
            draw = torch.empty(len(unseeded), probs.shape[1]).exponential_(generator=shared)
            noise[torch.tensor(unseeded, device=logits.device)] = draw.to(noise.device)
        for j, i in enumerate(sampled):
            gen = rows[i].generator
            if gen is not None:
                noise[j] = torch.empty(probs.shape[1]).exponential_(generator=gen).to(noise.device)
        chosen[idx] = torch.argmax(probs / noise, dim=-1)
    tokens = chosen.tolist()
    logprobs = logprobs_all.gather(1, chosen[:, None])[:, 0].tolist()
    return tokens, logprobs


def _truncate(probs: torch.Tensor, rows: list[RowParams]) -> torch.Tensor:
    """Zero the tokens outside each row's top-k and top-p set (the most likely token always stays)."""
    needs = [r.top_k > 0 or r.top_p < 1.0 for r in rows]
    if not any(needs):
        return probs
    vocab = probs.shape[1]
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    ks = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=probs.device)
    ps = torch.tensor([r.top_p for r in rows], device=probs.device, dtype=probs.dtype)
    rank = torch.arange(vocab, device=probs.device)[None, :]
    # Keep a token while the mass strictly before it is below top_p (so the first always stays).
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    keep_sorted = (rank < ks[:, None]) & (mass_before < ps[:, None])
    keep = torch.zeros_like(keep_sorted).scatter(1, order, keep_sorted)
    return probs * keep
