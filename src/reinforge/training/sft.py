"""Supervised fine-tuning on chat conversations: the warm start before RL.

Conversations are rendered with the tokenizer's own chat template, and only the tokens the assistant
produced (what the engine will later generate, end-of-turn token included) carry loss. Rendering goes
through the same template the engine uses for prompts, so a warm-started model sees at RL time exactly
the token sequences it was trained on.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from transformers import PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicCache, DynamicLayer

from reinforge.errors import InvalidRequestError
from reinforge.training.device import native_bfloat16


class SftConfig(BaseModel):
    """Hyper-parameters of the warm start. The defaults are what a 1M-parameter model needs."""

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(default=3e-3, gt=0)
    batch_size: int = Field(default=64, ge=1)
    steps: int = Field(default=300, ge=1)
    warmup_steps: int = Field(default=20, ge=0)
    weight_decay: float = Field(default=0.0, ge=0)
    max_seconds: float | None = Field(default=None, gt=0)
    """Stop early after this much wall time (the schedule still decays over `steps`)."""
    seed: int = 0
    threads: int | None = Field(default=None, ge=1)
    """torch's CPU threads while training (None: as the process has them; `reinforge sft` records on
    one)."""
    batching: Literal["random", "length_grouped"] = "random"
    """`random` draws each batch's examples with replacement; `length_grouped` goes through the examples
    epoch by epoch in batches of similar lengths, which pads far less when lengths vary widely."""
    prompt_loss_weight: float = Field(default=0.0, ge=0.0, le=1.0)
    """The loss weight of context tokens (prompts, tool results) beside the trained tokens' 1. Above
    zero the model also learns to predict its prompts, where a schema or a page repeats its names:
    copy practice that the replies alone give slowly (docs/experiments.md: sql names spelt like held-out
    names)."""
    shared_prefix: bool = False
    """Run the context that every example of a batch starts with (a system prompt, demonstration
    dialogues) through the model once per step and each example's own tokens on top of its keys and
    values (as `algorithms.shared_prefix` does for RL's groups): the same loss and gradient (the
    gradient reaches the prefix through its cache), at a fraction of the tokens when a long prompt
    is shared. Needs `prompt_loss_weight = 0`."""
    dtype: Literal["float32", "bfloat16", "auto"] = "float32"
    """`bfloat16` runs the forward and backward passes under bfloat16 autocast while the weights and
    the optimizer stay in float32: faster where the CPU has bfloat16 matrix units (AMX, AVX512-BF16)
    or on a GPU, at bfloat16's precision in the activations, and much slower on a CPU without them.
    `auto` takes bfloat16 where the model's device runs it natively (`device.native_bfloat16`) and
    float32 elsewhere, so one config is fast on both kinds of machine."""
    return_freed_memory: bool = True
    """Hand freed memory back to the OS while `reinforge sft` trains (`training.memory.
    returning_freed_memory`, as `[trainer.compute] return_freed_memory` does for RL): batches of
    changing lengths otherwise leave each step's activations resident."""


class SftExample(BaseModel):
    """One rendered conversation: token ids and which of them are trained (1) or context (0)."""

    model_config = ConfigDict(extra="forbid")

    input_ids: list[int]
    loss_mask: list[int]


class SftReport(BaseModel):
    steps: int
    seconds: float
    first_loss: float
    last_loss: float
    precision: Literal["float32", "bfloat16"] = "float32"
    """What the passes ran in (`auto` resolved)."""


def _render_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    add_generation_prompt: bool,
) -> list[int]:
    text = tokenizer.apply_chat_template(
        list(messages),
        tools=list(tools) if tools is not None else None,
        add_generation_prompt=add_generation_prompt,
        tokenize=False,
    )
    assert isinstance(text, str)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def render_conversation(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[dict[str, Any]],
    tools: list[dict[str, Any]] | None = None,
) -> SftExample:
    """Token ids of the whole conversation and a mask over the assistant's own tokens.

    Each assistant turn's tokens are what follows the generation prompt for the turns before it, so
    the mask marks exactly what the engine would have generated. A template that is not prefix-stable
    (re-rendering history differently) is an error, because training on such data would teach the
    model tokens it never sees at inference.
    """
    full = _render_ids(tokenizer, messages, tools, add_generation_prompt=False)
    mask = [0] * len(full)
    for i, message in enumerate(messages):
        if message.get("role") != "assistant":
            continue
        prompt = _render_ids(tokenizer, messages[:i], tools, add_generation_prompt=True)
        upto = _render_ids(tokenizer, messages[: i + 1], tools, add_generation_prompt=False)
        if full[: len(upto)] != upto or upto[: len(prompt)] != prompt:
            raise InvalidRequestError(
                "the chat template is not prefix-stable: rendering a shorter history changes its tokens"
            )
        for pos in range(len(prompt), len(upto)):
            mask[pos] = 1
    if not any(mask):
        raise InvalidRequestError("a conversation for supervised training needs at least one assistant turn")
    return SftExample(input_ids=full, loss_mask=mask)


def _collate(
    batch: Sequence[SftExample], pad_id: int, device: torch.device, prompt_weight: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids, attention and loss weights: 1 on trained tokens, `prompt_weight` on the rest."""
    width = max(len(ex.input_ids) for ex in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(batch), width), dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, ex in enumerate(batch):
        n = len(ex.input_ids)
        ids[row, :n] = torch.tensor(ex.input_ids)
        attention[row, :n] = 1
        mask[row, :n] = torch.tensor(ex.loss_mask, dtype=torch.float32)
    if prompt_weight:
        mask += prompt_weight * (attention.float() - mask)
    return ids.to(device), attention.to(device), mask.to(device)  # no copy when already there


def masked_lm_loss(
    model: PreTrainedModel, ids: torch.Tensor, attention: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy over the positions whose mask is 1."""
    return _next_token_loss(model(input_ids=ids, attention_mask=attention).logits, ids, mask)


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    logits = logits[:, :-1].float()
    targets = ids[:, 1:]
    weights = mask[:, 1:]
    losses = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none"
    ).view_as(weights)
    return (losses * weights).sum() / weights.sum().clamp(min=1.0)


def shared_prefix_length(batch: Sequence[SftExample]) -> int:
    """How many leading tokens every example of `batch` has in common, stopping short of the token
    before the first trained one (that position's logits predict a trained token)."""
    first = batch[0].input_ids
    common = 0
    for i in range(min(len(ex.input_ids) for ex in batch)):
        if any(ex.input_ids[i] != first[i] for ex in batch):
            break
        common += 1
    trained_from = min(ex.loss_mask.index(1) if 1 in ex.loss_mask else len(ex.loss_mask) for ex in batch)
    return max(0, min(common, trained_from - 1))


def shared_prefix_loss(
    model: PreTrainedModel, batch: Sequence[SftExample], pad_id: int, device: torch.device
) -> torch.Tensor:
    """`masked_lm_loss` of `batch`, the common prefix run once (`SftConfig.shared_prefix`); a model
    whose cache is not a plain growing KV cache gets the ordinary forward."""
    length = shared_prefix_length(batch)
    if length == 0:
        return masked_lm_loss(model, *_collate(batch, pad_id, device))
    prefix = torch.tensor([batch[0].input_ids[:length]], dtype=torch.long, device=device)
    cache = getattr(model(input_ids=prefix, use_cache=True), "cache", None)
    if not isinstance(cache, DynamicCache) or not all(type(layer) is DynamicLayer for layer in cache.layers):
        return masked_lm_loss(model, *_collate(batch, pad_id, device))
    cache.batch_repeat_interleave(len(batch))
    rest = [SftExample(input_ids=ex.input_ids[length:], loss_mask=ex.loss_mask[length:]) for ex in batch]
    ids, attention, mask = _collate(rest, pad_id, device)
    seen = torch.ones((len(batch), length), dtype=attention.dtype, device=device)
    positions = (torch.arange(ids.shape[1], device=device) + length).expand(len(batch), -1)
    out = model(
        input_ids=ids,
        attention_mask=torch.cat([seen, attention], dim=1),
        position_ids=positions,
        cache=cache,
        use_cache=True,
    )
    # The prefix's last position predicts the first token after it, which carries no loss (by
    # `shared_prefix_length`), so the suffix's own logits are every prediction that counts.
    return _next_token_loss(out.logits, ids, mask)


def _lr_factor(step: int, config: SftConfig) -> float:
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


LENGTH_GROUP_BATCHES = 32
"""Batches per length group: each group of this many batches' examples is sorted by length before it
is cut into batches, so a batch pads to a length close to its own examples' (as transformers'
`LengthGroupedSampler` does) while the order across groups stays random."""


def _random_batches(n: int, batch_size: int, rng: random.Random) -> Iterator[list[int]]:
    while True:
        yield [rng.randrange(n) for _ in range(batch_size)]


def length_grouped_batches(
    lengths: Sequence[int], batch_size: int, rng: random.Random
) -> Iterator[list[int]]:
    """Endless batches of example indices: every example once per epoch, batches of similar lengths."""
    order = list(range(len(lengths)))
    group = batch_size * LENGTH_GROUP_BATCHES
    while True:
        rng.shuffle(order)
        batches: list[list[int]] = []
        for start in range(0, len(order), group):
            chunk = sorted(order[start : start + group], key=lengths.__getitem__)
            batches += [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
        rng.shuffle(batches)
        yield from batches


def supervised_finetune(
    model: PreTrainedModel,
    examples: Sequence[SftExample],
    config: SftConfig | None = None,
    *,
    pad_id: int = 0,
    on_step: Callable[[int, float], None] | None = None,
    augment: Callable[[SftExample, random.Random], SftExample] | None = None,
) -> SftReport:
    """Train `model` in place on `examples` (batches as `config.batching` says; cosine schedule).

    `augment` changes each example as it is drawn (for instance `sft_rewrite.RewritingExamples`,
    which gives a conversation fresh names every time), with the run's own seeded generator.
    """
    config = config or SftConfig()
    if not examples:
        raise InvalidRequestError("supervised_finetune needs at least one example")
    if config.shared_prefix and config.prompt_loss_weight:
        raise InvalidRequestError("shared_prefix trains no context tokens: set prompt_loss_weight = 0")
    rng = random.Random(config.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=config.learning_rate, weight_decay=config.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: _lr_factor(s, config))
    threads_before = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    model.train()
    device = next(model.parameters()).device
    bfloat16 = config.dtype == "bfloat16" or (config.dtype == "auto" and native_bfloat16(device))
    start = time.monotonic()
    first_loss = last_loss = float("nan")
    step = 0
    batches = (
        length_grouped_batches([len(ex.input_ids) for ex in examples], config.batch_size, rng)
        if config.batching == "length_grouped"
        else _random_batches(len(examples), config.batch_size, rng)
    )
    try:
        for step in range(1, config.steps + 1):
            batch = [examples[i] for i in next(batches)]
            if augment is not None:
                batch = [augment(ex, rng) for ex in batch]
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bfloat16):
                if config.shared_prefix:
                    loss = shared_prefix_loss(model, batch, pad_id, device)
                else:
                    loss = masked_lm_loss(model, *_collate(batch, pad_id, device, config.prompt_loss_weight))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            last_loss = float(loss.detach())
            if step == 1:
                first_loss = last_loss
            if on_step is not None:
                on_step(step, last_loss)
            if config.max_seconds is not None and time.monotonic() - start > config.max_seconds:
                break
    finally:
        model.eval()
        torch.set_num_threads(threads_before)
    return SftReport(
        steps=step,
        seconds=time.monotonic() - start,
        first_loss=first_loss,
        last_loss=last_loss,
        precision="bfloat16" if bfloat16 else "float32",
    )
