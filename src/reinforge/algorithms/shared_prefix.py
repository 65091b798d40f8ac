"""Token logprobs with each distinct prompt encoded once: the group's rollouts share its KV.

GRPO-style batches hold `group_size` rows per prompt, and short completions make the prompt most of
each row. Running every row's prompt through the model again costs the policy update most of its
time; here each distinct prompt goes through one forward (with gradients), its key/value cache is
indexed out to the rows that start with it, and only the rows' own tokens run on top of it. The
gradient flows into the shared prompt once per row through that cache, so the result is the same
function as `compute_token_logprobs` (up to float summation order), at a fraction of the tokens.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, DynamicLayer

from reinforge.algorithms.batch import TokenBatch
from reinforge.algorithms.logprobs import TokenLogprobs, check_sampling, target_logprobs

MIN_SAVING = 0.8
"""Share only when the two forwards cover at most this share of the padded batch's tokens."""


def prompt_groups(batch: TokenBatch) -> tuple[list[list[int]], list[int]]:
    """The distinct prompts of `batch` and, for each row, the index of its prompt."""
    seen: dict[tuple[int, ...], int] = {}
    rows: list[int] = []
    for ids, length in zip(batch.input_ids.tolist(), batch.prompt_lengths.tolist(), strict=True):
        rows.append(seen.setdefault(tuple(ids[:length]), len(seen)))
    return [list(p) for p in seen], rows


def shared_prefix_logprobs(
    model: nn.Module,
    batch: TokenBatch,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    with_entropy: bool = False,
) -> TokenLogprobs | None:
    """`compute_token_logprobs` for a right-padded batch, each distinct prompt computed once.

    Returns None when sharing would not save much (few rows per prompt, long completions), when a
    prompt is empty, or when the model's cache is not a plain growing KV cache (sliding windows and
    other layouts are left to the ordinary forward).
    """
    check_sampling(temperature, top_p, top_k)
    prompts, row_prompt = prompt_groups(batch)
    rows, width = batch.input_ids.shape
    plen = batch.prompt_lengths
    lengths = batch.attention_mask.sum(-1)
    if min(len(p) for p in prompts) < 1:
        return None
    prefix_len = max(len(p) for p in prompts)
    suffix_len = int((lengths - plen).max())
    if suffix_len < 1 or len(prompts) * prefix_len + rows * suffix_len > MIN_SAVING * rows * width:
        return None
    pad = 0  # any id: padding is masked out as a key and its outputs are never read
    device = batch.input_ids.device

    # 1. Each distinct prompt once, right-padded; its logits at the last prompt token predict the
    #    first response token of every row that starts with it.
    prefix_ids = torch.full((len(prompts), prefix_len), pad, dtype=torch.long, device=device)
    prefix_mask = torch.zeros((len(prompts), prefix_len), dtype=torch.long, device=device)
    for u, prompt in enumerate(prompts):
        prefix_ids[u, : len(prompt)] = torch.tensor(prompt, dtype=torch.long)
        prefix_mask[u, : len(prompt)] = 1
    positions = torch.arange(prefix_len, device=device).expand(len(prompts), -1)
    first = model(input_ids=prefix_ids, attention_mask=prefix_mask, position_ids=positions, use_cache=True)
    cache = getattr(first, "cache", None)
    if not isinstance(cache, DynamicCache) or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return None
    index = torch.tensor(row_prompt, dtype=torch.long, device=device)
    cache.batch_select_indices(index)

    # 2. Every row's own tokens on top of its prompt's cache (prompt padding masked out).
    offsets = torch.arange(suffix_len, device=device)
    columns = plen.unsqueeze(-1) + offsets  # [B, S] positions in the row
    valid = columns < lengths.unsqueeze(-1)
    safe = columns.clamp(max=width - 1)
    suffix_ids = torch.where(valid, batch.input_ids.gather(1, safe), torch.full_like(safe, pad))
    mask = torch.cat([prefix_mask[index], valid.long()], dim=1)
    second = model(
        input_ids=suffix_ids,
        attention_mask=mask,
        position_ids=columns,
        cache=cache,
        use_cache=True,
    )
    last_prompt = first.logits[index, plen - 1]  # [B, V]
    predicting = torch.cat([last_prompt.unsqueeze(1), second.logits[:, :-1]], dim=1)  # [B, S, V]

    targets = (batch.response_mask.gather(1, safe) > 0) & valid
    picked, token_entropy = target_logprobs(
        predicting[targets],
        suffix_ids[targets],
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        with_entropy=with_entropy,
    )
    row_idx, col_idx = targets.nonzero(as_tuple=True)
    where = (row_idx, columns[row_idx, col_idx])
    logprobs = torch.zeros((rows, width), dtype=torch.float32, device=device)
    logprobs = logprobs.index_put(where, picked)
    result = TokenLogprobs(logprobs=logprobs)
    if token_entropy is not None:
        result.entropy = torch.zeros((rows, width), dtype=torch.float32, device=device).index_put(
            where, token_entropy
        )
    return result
