"""Batched sampling with per-request parameters and per-request seeds, and the one definition of
the behaviour logprob.

The recorded logprob of a chosen token is its log-probability under the distribution it was
actually sampled from (`sampling_logits`): the logits after penalties, logit bias and a grammar
(`LogitShaper`), divided by the temperature, with the tokens outside top-k and then top-p removed
(vLLM's and Hugging Face's order: top-p over the top-k renormalised). This is what verl and TRL
record, and what vLLM returns with `logprobs_mode="processed_logprobs"`.

The trainer recomputes π_old with the same function at the run's temperature, top-p and top-k, so
before the first update π_old and the behaviour logprobs agree exactly. Penalties, bias and grammars
stay behaviour-only: the policy's own distribution has none of them, and truncated importance
sampling corrects for the difference.

Greedy decoding (temperature 0) samples from no distribution; it records the log-probability under
the shaped logits at temperature 1 without truncation (what vLLM and SGLang return for a greedy
request). Greedy calls are validation's, never trained on.

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
    """Penalties, bias or a grammar: part of the behaviour distribution, never of the policy's."""


def _per_row(value: float | torch.Tensor, rows: int, like: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=like.device, dtype=dtype)
    return torch.full((rows,), value, device=like.device, dtype=dtype)


def sampling_logits(
    logits: torch.Tensor,
    temperature: float | torch.Tensor,
    top_p: float | torch.Tensor = 1.0,
    top_k: int | torch.Tensor = 0,
    *,
    keep: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits of the distribution sampled from, for float `logits [n, vocab]`.

    Each row is divided by its temperature (a temperature of 0 counts as 1: greedy, see the module
    docstring), then tokens outside its top-k (0: no top-k) and then outside its top-p set are set
    to -inf. A token stays in the top-p set while the probability mass strictly before it is below
    top_p, so the most likely token always stays. `keep [n]` names a token per row that stays in the
    set whatever: the trainer's target, which the sampler kept, so float noise near the boundary
    can't make its logprob -inf. Differentiable in `logits` (the set is chosen without gradients).
    """
    rows, vocab = logits.shape
    temps = _per_row(temperature, rows, logits, logits.dtype)
    scaled = logits / torch.where(temps > 0, temps, torch.ones_like(temps))[:, None]
    ks = _per_row(top_k, rows, logits, torch.long)
    ps = _per_row(top_p, rows, logits, torch.float32)
    truncate_k = (ks > 0) & (ks < vocab)
    if not bool(truncate_k.any()) and not bool((ps < 1.0).any()):
        return scaled
    with torch.no_grad():
        sorted_logits, order = torch.sort(scaled.detach().float(), dim=-1, descending=True)
        rank = torch.arange(vocab, device=logits.device)[None, :]
        in_top_k = ~truncate_k[:, None] | (rank < ks[:, None])
        probs = torch.softmax(sorted_logits.masked_fill(~in_top_k, float("-inf")), dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        kept_sorted = in_top_k & (mass_before < ps[:, None])
        kept = torch.zeros_like(kept_sorted).scatter(1, order, kept_sorted)
        if keep is not None:
            kept[torch.arange(rows, device=logits.device), keep.to(logits.device)] = True
    return scaled.masked_fill(~kept, float("-inf"))


def sample(
    logits: torch.Tensor, rows: list[RowParams], shared: torch.Generator
) -> tuple[list[int], list[float]]:
    """Choose one token per row of float32 `logits [n, vocab]`; return tokens and their logprobs
    under the distribution each was sampled from (module docstring)."""
    shaped = [i for i, r in enumerate(rows) if r.shaper is not None]
    if shaped:
        logits = logits.clone()
        for i in shaped:
            shaper = rows[i].shaper
            assert shaper is not None
            shaper.shape(logits[i])
    device = logits.device
    greedy = [r.temperature <= 0 for r in rows]
    # All greedy: the distribution is the logits themselves (dividing by 1 changes no bit), so the
    # vocabulary-wide pass and copy of `sampling_logits` are skipped.
    processed = (
        logits
        if all(greedy)
        else sampling_logits(
            logits,
            torch.tensor([r.temperature for r in rows], device=device, dtype=logits.dtype),
            torch.tensor([1.0 if g else r.top_p for r, g in zip(rows, greedy, strict=True)], device=device),
            torch.tensor([0 if g else r.top_k for r, g in zip(rows, greedy, strict=True)], device=device),
        )
    )
    logprobs_all = torch.log_softmax(processed, dim=-1)
    chosen = torch.argmax(logits, dim=-1)
    sampled = [i for i, g in enumerate(greedy) if not g]
    if sampled:
        idx = torch.tensor(sampled, device=device)
        probs = logprobs_all.index_select(0, idx).exp()
        noise = torch.empty_like(probs)
        unseeded = [j for j, i in enumerate(sampled) if rows[i].generator is None]
        if unseeded:
            # The CPU generator draws on CPU; noise is moved to the logits' device.
            draw = torch.empty(len(unseeded), probs.shape[1]).exponential_(generator=shared)
            noise[torch.tensor(unseeded, device=device)] = draw.to(noise.device)
        for j, i in enumerate(sampled):
            gen = rows[i].generator
            if gen is not None:
                noise[j] = torch.empty(probs.shape[1]).exponential_(generator=gen).to(noise.device)
        chosen[idx] = torch.argmax(probs / noise, dim=-1)
    tokens = chosen.tolist()
    logprobs = logprobs_all.gather(1, chosen[:, None])[:, 0].tolist()
    return tokens, logprobs
