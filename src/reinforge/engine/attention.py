"""Attention over the slot KV cache: the masks (causal, sliding window) and cascade decode.

Cascade decode: when every running sequence starts with the same tokens (agents sharing a system
prompt and tools, the rollouts of one task), their caches hold the same keys and values for that
prefix, and a plain decode step reads it once per sequence. Here the prefix is read once, from the
first slot, for all rows together: the queries of every row are one matrix against the shared keys
(a real matrix product instead of `rows` matrix-vector products), each row's own suffix is attended
separately, and one softmax over both parts joins them exactly.
"""

from __future__ import annotations

import torch


def visible(keys: torch.Tensor, queries: torch.Tensor, window: int | None) -> torch.Tensor:
    """Which key positions (`keys`, 1-D) each query position (`queries`, any shape) sees: `[..., k]`
    booleans, causal and, with a sliding window, only keys at positions > query - window (Hugging
    Face's rule)."""
    mask = keys <= queries[..., None]
    if window is not None:
        mask &= keys > queries[..., None] - window
    return mask


def per_prompt_masks(
    arange: torch.Tensor, starts: list[int], lens: list[int], window: int | None
) -> list[torch.Tensor | None]:
    """Prefill, one attention call per prompt: prompt i's `lens[i]` queries (after `starts[i]` cached
    positions) over its cached + new positions; None where plain causal attention is the same."""
    return [
        None
        if not c and (window is None or window >= n)
        else visible(arange[: c + n], c + arange[:n], window)
        for c, n in zip(starts, lens, strict=True)
    ]


def padded_mask(arange: torch.Tensor, starts: list[int], lens: list[int], window: int | None) -> torch.Tensor:
    """Prefill, one padded call for all prompts: `[prompts, 1, longest, span]`, query j of prompt i
    sees positions up to starts[i] + j."""
    width = max(lens)
    span = max(c + n for c, n in zip(starts, lens, strict=True))
    query_pos = torch.tensor(starts, device=arange.device)[:, None] + arange[:width][None, :]
    return visible(arange[:span], query_pos, window)[:, None]


def cascade_decode(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shared: int,
    span: int,
    bias: torch.Tensor,
    scale: float,
    prefix_slot: int = 0,
) -> torch.Tensor:
    """One decode step's attention for rows `0..n-1` whose first `shared` cached positions hold the same
    keys and values (read once, from `prefix_slot`). `q`: `[n, heads, head_dim]`; `k`, `v`: one layer's
    cache `[slots, kv_heads, capacity, head_dim]`; `bias`: `[n, 1, 1, span]` additive mask (0 or -inf)
    over positions `0..span-1`. Returns `[n, heads, head_dim]`."""
    n = q.shape[0]
    return cascade_attention(q[:, None], k, v, shared, span, bias.view(n, 1, -1), scale, prefix_slot)[:, 0]


def cascade_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    shared: int,
    span: int,
    bias: torch.Tensor,
    scale: float,
    prefix_slot: int = 0,
) -> torch.Tensor:
    """Cascade attention for `width` queries per slot (a decode step: one; a speculative verify: the
    next token and its drafts). `q`: `[n, width, heads, head_dim]`; `k`, `v` as in `cascade_decode`;
    `bias`: `[n, width, span]` additive mask. Returns `[n, width, heads, head_dim]`."""
    n, width, heads, dim = q.shape
    kv = k.shape[1]
    group = heads // kv
    # A slot's queries of one KV head are one block of rows: [n, kv, width * group, dim].
    rows = (q * scale).view(n, width, kv, group, dim).transpose(1, 2).reshape(n, kv, width * group, dim)
    # Scores are laid out [kv_heads, rows, width * group, span]: the shared part is then one matrix per KV
    # head that needs no transposing, on the way in or out.
    stacked = rows.transpose(0, 1).reshape(kv, n * width * group, dim)
    prefix_scores = torch.matmul(stacked, k[prefix_slot, :, :shared].transpose(1, 2)).view(
        kv, n, width * group, shared
    )
    own_scores = torch.matmul(rows, k[:n, :, shared:span].transpose(2, 3)).transpose(0, 1)
    scores = torch.cat([prefix_scores, own_scores], dim=-1).float()
    scores.view(kv, n, width, group, span).add_(bias[:, :, None])
    probs = torch.softmax(scores, dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., shared:].transpose(0, 1), v[:n, :, shared:span])
    prefix_probs = probs[..., :shared].reshape(kv, n * width * group, shared)
    out += (
        torch.matmul(prefix_probs, v[prefix_slot, :, :shared]).view(kv, n, width * group, dim).transpose(0, 1)
    )
    return out.view(n, kv, width, group, dim).transpose(1, 2).reshape(n, width, heads, dim)


def additive(mask: torch.Tensor) -> torch.Tensor:
    """A boolean mask as a float32 bias: 0 where visible, -inf elsewhere."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill_(~mask, float("-inf"))
