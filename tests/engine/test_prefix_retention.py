"""Finished sequences' caches stay in free slots for later prompts to copy: outputs equal an engine
that keeps nothing, weight updates drop them, live sequences always get their slots, and a cache
kept under one adapter never serves another."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable

import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine, EngineOutput
from reinforge.engine.adapters import lora_key
from reinforge.inference.contract import SamplingParams

from .conftest import diversify

GREEDY = SamplingParams(temperature=0, max_tokens=12)


def _prompt(tokenizer: PreTrainedTokenizerFast, text: str) -> list[int]:
    return [tokenizer.bos_token_id, *tokenizer(text)["input_ids"]]


def _assert_same(a: EngineOutput, b: EngineOutput) -> None:
    assert a.token_ids == b.token_ids
    assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-4, rtol=0)


def _recomputed_logprobs(model: torch.nn.Module, prompt: list[int], out: EngineOutput) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + out.token_ids])).logits[0]
    rows = torch.log_softmax(logits[len(prompt) - 1 : -1].float(), dim=-1)
    return rows[torch.arange(len(out.token_ids)), torch.tensor(out.token_ids)]


def _adapter_state(model: torch.nn.Module, name: str, seed: int, rank: int = 2) -> dict[str, torch.Tensor]:
    """A random adapter on every layer's q and v projections (non-zero B, so it changes the output)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for path, module in model.named_modules():
        if path.endswith(("self_attn.q_proj", "self_attn.v_proj")):
            assert isinstance(module, torch.nn.Linear)
            a = torch.randn(rank, module.in_features, generator=gen)
            b = torch.randn(module.out_features, rank, generator=gen)
            state[lora_key(name, path, "lora_A")] = a * 0.3
            state[lora_key(name, path, "lora_B")] = b * 0.3
            state[lora_key(name, path, "scale")] = torch.tensor(2.0)
    return state


async def test_cpu_a_follow_up_prompt_copies_a_finished_requests_cache(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """The next call of a conversation (previous prompt + its completion + a tool result) arrives
    after the previous call ended: it copies that call's prompt and completion from the retained
    cache and computes only the new tokens, with the outputs of an engine that keeps nothing."""
    first = _prompt(tokenizer, "What is 3 plus 4? It is 7. What is 5 plus 6?")
    retaining = make_engine(endless, tokenizer)
    plain = make_engine(endless, tokenizer, retain_prefixes=False)
    outs = [await engine.generate(first, GREEDY) for engine in (retaining, plain)]
    _assert_same(*outs)
    assert retaining.stats()["retained_entries"] == 1
    assert plain.stats()["retained_entries"] == 0

    follow = first + outs[0].token_ids + tokenizer(" And 8 plus 9?")["input_ids"]
    params = SamplingParams(temperature=0, max_tokens=10)
    again = [await engine.generate(follow, params) for engine in (retaining, plain)]
    _assert_same(*again)
    reused = len(first) + len(outs[0].token_ids) - 1  # the last sampled token was never fed back
    stats = retaining.stats()
    assert stats["prefix_retained_hits"] == reused
    assert stats["prefix_cached_tokens"] == reused
    assert stats["retained_entries"] == 1  # the follow-up's cache contains the first one's: replaced
    assert plain.stats()["prefix_cached_tokens"] == 0
    expected = _recomputed_logprobs(endless, follow, again[0])
    assert torch.allclose(torch.tensor(again[0].logprobs), expected, atol=1e-4, rtol=0)


async def test_cpu_identical_finished_rollouts_are_kept_once(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """A group of greedy rollouts of one task ends with identical caches: one slot keeps them, and the
    next request on that task copies all of its prompt but the last token."""
    task = _prompt(tokenizer, "What is 12 plus 30? Think step by step, then answer.")
    engine = make_engine(endless, tokenizer, max_batch_size=8)
    outs = await asyncio.gather(*(engine.generate(task, GREEDY) for _ in range(4)))
    assert len({tuple(o.token_ids) for o in outs}) == 1
    assert engine.stats()["retained_entries"] == 1
    before = engine.stats()["prefix_cached_tokens"]
    out = await engine.generate(task, GREEDY)
    assert out.token_ids == outs[0].token_ids
    assert engine.stats()["prefix_cached_tokens"] - before == len(task) - 1
    assert engine.stats()["prefix_retained_hits"] == len(task) - 1


async def test_cpu_a_weight_update_drops_every_retained_cache(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """Retained keys and values were computed by the old weights: after an update a follow-up prompt
    is computed in full, exactly as a fresh engine on the new weights computes it."""
    new_weights = diversify(copy.deepcopy(endless), seed=7).state_dict()
    engine = make_engine(copy.deepcopy(endless), tokenizer)
    first = _prompt(tokenizer, "What is 21 plus 13? It is 34. What is 2 plus 9?")
    out = await engine.generate(first, GREEDY)
    assert engine.stats()["retained_entries"] == 1
    await engine.load_weights(new_weights, version=1)
    assert engine.stats()["retained_entries"] == 0

    follow = first + out.token_ids + tokenizer(" Then 1 plus 1?")["input_ids"]
    served = await engine.generate(follow, GREEDY)
    fresh_model = copy.deepcopy(endless)
    fresh_model.load_state_dict(new_weights)
    fresh = await make_engine(fresh_model, tokenizer).generate(follow, GREEDY)
    _assert_same(served, fresh)
    assert served.policy_version == 1
    assert engine.stats()["prefix_retained_hits"] == 0
    assert engine.stats()["prefix_cached_tokens"] == 0


async def test_cpu_retained_caches_give_way_to_live_sequences(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """Many finished requests fill the free slots; then max_batch_size long requests arrive at once,
    some extending retained caches that live in the very slots they are admitted into: all run
    together (retention never delays admission), their outputs equal an engine that keeps nothing,
    and the caches are evicted to make room."""
    slots = 4
    retaining = make_engine(endless, tokenizer, max_batch_size=slots)
    plain = make_engine(endless, tokenizer, max_batch_size=slots, retain_prefixes=False)
    short = [_prompt(tokenizer, f"What is {i} plus {2 * i + 1}? Say it twice, please.") for i in range(10)]
    earlier: list[list[EngineOutput]] = []
    for engine in (retaining, plain):
        earlier.append(list(await asyncio.gather(*(engine.generate(p, GREEDY) for p in short))))
    for a, b in zip(*earlier, strict=True):
        _assert_same(a, b)
    assert 1 <= retaining.stats()["retained_entries"] <= slots

    # Extend the requests that finished last (most likely still retained) and add fresh prompts.
    long_params = SamplingParams(temperature=0, max_tokens=40)
    extra = tokenizer(" Now count to ten.")["input_ids"]
    late = [short[i] + earlier[0][i].token_ids + extra for i in (9, 8)]
    late += [_prompt(tokenizer, f"What is {i} plus {i}? " * 3) for i in (30, 31)]
    results = []
    for engine in (retaining, plain):
        results.append(await asyncio.gather(*(engine.generate(p, long_params) for p in late)))
    for a, b in zip(*results, strict=True):
        _assert_same(a, b)
        assert len(a.token_ids) == 40
    stats = retaining.stats()
    assert stats["peak_running"] == slots
    assert stats["prefix_retained_hits"] > 0
    assert stats["retained_entries"] <= slots


async def test_cpu_retained_caches_move_above_a_growing_batch(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """Four requests end together and leave their caches in slots 0-3; each later request runs in
    slot 0, so the cache living there moves to a free slot above first (in the copy that admits the
    newcomer). Every later follow-up still finds its own cache, and outputs equal the plain engine."""
    retaining = make_engine(endless, tokenizer, max_batch_size=8)
    plain = make_engine(endless, tokenizer, max_batch_size=8, retain_prefixes=False)
    tasks = [_prompt(tokenizer, f"Task {i}: what is {i} plus {i * 5}? Explain it to me.") for i in range(4)]
    firsts = []
    for engine in (retaining, plain):
        firsts.append(await asyncio.gather(*(engine.generate(t, GREEDY) for t in tasks)))
    assert retaining.stats()["retained_entries"] == 4
    other = _prompt(tokenizer, "Something else entirely, with no shared start at all.")
    _assert_same(*[await engine.generate(other, GREEDY) for engine in (retaining, plain)])
    assert retaining.stats()["retained_entries"] == 5
    expected_hits = 0
    for task, first in zip(tasks, firsts[0], strict=True):
        follow = task + first.token_ids + tokenizer(" Why?")["input_ids"]
        _assert_same(*[await engine.generate(follow, GREEDY) for engine in (retaining, plain)])
        expected_hits += len(task) + len(first.token_ids) - 1
    assert retaining.stats()["prefix_retained_hits"] == expected_hits


async def test_cpu_staggered_traffic_with_retention_equals_without(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """Requests of mixed lengths arriving while others run and end (entries retained, moved above the
    growing batch, evicted, copied from): every output equals the engine that keeps nothing."""
    base = [_prompt(tokenizer, f"Question {q}: what is {q} plus {q * 3}? Answer in words.") for q in range(6)]

    async def traffic(engine: Engine) -> list[EngineOutput]:
        outs: list[EngineOutput] = []

        async def call(prompt: list[int], n: int, delay: float) -> EngineOutput:
            await asyncio.sleep(delay)
            return await engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n))

        firsts = await asyncio.gather(*(call(p, 6 + 5 * (i % 3), 0.01 * i) for i, p in enumerate(base)))
        outs.extend(firsts)
        nxt = tokenizer(" Next?")["input_ids"]
        follows = [p + o.token_ids + nxt for p, o in zip(base, firsts, strict=True)]
        outs.extend(
            await asyncio.gather(*(call(f, 4 + 7 * (i % 2), 0.005 * i) for i, f in enumerate(follows)))
        )
        return outs

    retaining = make_engine(endless, tokenizer, max_batch_size=8)
    plain = make_engine(endless, tokenizer, max_batch_size=8, retain_prefixes=False)
    for a, b in zip(await traffic(retaining), await traffic(plain), strict=True):
        _assert_same(a, b)
    assert retaining.stats()["prefix_retained_hits"] > 0


async def test_cpu_a_cache_retained_under_one_adapter_never_serves_another(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """Another adapter's keys and values for the same tokens differ: a follow-up under adapter B (or
    the base) computes in full, one under A copies A's cache; an adapter-only update drops them."""
    adapters = {**_adapter_state(endless, "alpha", 1), **_adapter_state(endless, "beta", 2)}
    retaining = make_engine(copy.deepcopy(endless), tokenizer)
    plain = make_engine(copy.deepcopy(endless), tokenizer, retain_prefixes=False)
    for engine in (retaining, plain):
        await engine.load_weights(adapters, version=1)
    first = _prompt(tokenizer, "What is 17 plus 5? It is 22. What is 6 plus 1?")
    others = [_prompt(tokenizer, f"What is {i} plus {i}?") for i in range(3)]
    short = SamplingParams(temperature=0, max_tokens=4)
    outs = []
    for engine in (retaining, plain):  # a batch of four: the cache has four slots from now on
        batch = [engine.generate(p, short) for p in others]
        outs.append((await asyncio.gather(engine.generate(first, GREEDY, adapter="alpha"), *batch))[0])
    _assert_same(*outs)
    before = retaining.stats()["prefix_cached_tokens"]
    follow = first + outs[0].token_ids + tokenizer(" And 2 plus 2?")["input_ids"]

    for adapter in ("beta", None):
        served = [await engine.generate(follow, GREEDY, adapter=adapter) for engine in (retaining, plain)]
        _assert_same(*served)
        assert retaining.stats()["prefix_retained_hits"] == 0
        assert retaining.stats()["prefix_cached_tokens"] == before
    served = [await engine.generate(follow, GREEDY, adapter="alpha") for engine in (retaining, plain)]
    _assert_same(*served)
    assert retaining.stats()["prefix_retained_hits"] == len(first) + len(outs[0].token_ids) - 1

    assert retaining.stats()["retained_entries"] >= 1
    await retaining.load_weights(_adapter_state(endless, "alpha", 3), version=2)
    assert retaining.stats()["retained_entries"] == 0


async def test_cpu_retention_is_off_without_prefix_sharing(
    endless: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """`prefix_min_tokens=0` turns every copy off, so nothing is kept."""
    engine = make_engine(endless, tokenizer, prefix_min_tokens=0)
    first = _prompt(tokenizer, "What is 3 plus 4? It is 7. What is 5 plus 6?")
    out = await engine.generate(first, GREEDY)
    await engine.generate(first + out.token_ids, GREEDY)
    stats = engine.stats()
    assert stats["retained_entries"] == 0
    assert stats["prefix_cached_tokens"] == 0
