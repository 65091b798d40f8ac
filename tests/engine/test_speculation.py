"""Speculative decoding from n-grams of a sequence's own context: the drafts change how many forwards
run, never what is generated. Greedy tokens, seeded samples, logprobs, stops and finish reasons are
those of the engine without speculation, and unseeded samples follow the model's distribution."""

from __future__ import annotations

import asyncio
import copy
import math
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
)

from reinforge.engine import Engine, EngineOutput
from reinforge.engine.speculation import NgramDrafter, share_rows
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams

from .conftest import diversify, prompts
from .test_role_adapters import TARGETS, adapter_state, randomize

DRAFTS = 4
ROWS = 64
"""Drafts for every sequence of these tests' batches (a real engine drafts only while a forward is cheap)."""


def looping_prompts(tokenizer: PreTrainedTokenizerFast, count: int) -> list[list[int]]:
    """Prompts that repeat themselves, so the drafter finds what follows (and a tiny model's greedy
    output, which loops, gives it more)."""
    out = []
    for i in range(count):
        text = f"What is {i} plus {i % 4}? It is {i + i % 4}. " * (2 + i % 3) + f"What is {i} plus"
        out.append([tokenizer.bos_token_id, *tokenizer(text)["input_ids"]])
    return out


async def run_both(
    make_engine: Callable[..., Engine],
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    requests: list[tuple[list[int], SamplingParams]],
    *,
    stagger: float = 0.0,
    **kwargs: Any,
) -> tuple[list[EngineOutput], list[EngineOutput], dict[str, int]]:
    """The requests on an engine without speculation and on one with it (same model, same settings);
    `stagger` seconds between arrivals make requests join and leave a batch that is decoding."""
    results = []
    stats: dict[str, int] = {}
    for drafts in (0, DRAFTS):
        engine = make_engine(model, tokenizer, speculative_ngram=drafts, speculative_rows=ROWS, **kwargs)

        async def one(
            i: int, prompt: list[int], params: SamplingParams, engine: Engine = engine
        ) -> EngineOutput:
            await asyncio.sleep(stagger * i)
            return await engine.generate(prompt, params)

        results.append(await asyncio.gather(*(one(i, p, s) for i, (p, s) in enumerate(requests))))
        stats = engine.stats()
        engine.stop()
    return results[0], results[1], stats


def assert_same(plain: list[EngineOutput], fast: list[EngineOutput]) -> None:
    for i, (a, b) in enumerate(zip(plain, fast, strict=True)):
        assert b.token_ids == a.token_ids, f"request {i}"
        assert (b.finish_reason, b.text) == (a.finish_reason, a.text), f"request {i}"
        assert torch.allclose(torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0), (
            f"request {i}"
        )


# ---- the drafter ---------------------------------------------------------------------------------


def test_the_drafter_proposes_what_followed_the_latest_longest_match() -> None:
    history = [1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 1, 2, 3]
    drafter = NgramDrafter(max_n=3, min_n=1)
    # [1, 2, 3] occurred at 0 only (followed by 4 5 9 ...), though [2, 3] occurred later.
    assert drafter.propose(history, 3) == ([4, 5, 9], 3)
    # [6, 2, 3] never occurred; [2, 3] last did at the old end, followed by the 4 6 added since.
    assert drafter.propose([*history, 4, 6, 2, 3], 2) == ([4, 6], 2)
    assert drafter.propose([*history, 4, 6, 2, 3, 42], 4) == ([], 0)  # 42 never occurred before
    fresh = NgramDrafter(max_n=3, min_n=1)
    assert fresh.propose([*history, 4, 6, 9, 2, 3], 2) == ([7, 8], 3)  # [9, 2, 3] occurred, then 7
    assert NgramDrafter(min_n=1).propose([5, 5], 4) == ([5], 1)  # only what is known: the history's end
    assert NgramDrafter().propose([1, 2, 1], 4) == ([], 0)  # by default one token matches too little
    assert NgramDrafter().propose([1, 2, 1, 2], 0) == ([], 0)


def test_drafts_fill_the_cheap_rows_longest_matches_first() -> None:
    proposals = [([1, 2, 3], 1), ([4, 5, 6, 7], 3), ([], 0), ([8, 9], 2)]
    assert share_rows(proposals, 20) == [[1, 2, 3], [4, 5, 6, 7], [], [8, 9]]
    assert share_rows(proposals, 5) == [[], [4, 5, 6, 7], [], [8]]
    assert share_rows(proposals, 0) == [[], [], [], []]


def test_the_drafter_indexes_a_growing_history_as_a_fresh_one_would() -> None:
    history = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6]
    grown = NgramDrafter(max_n=2, min_n=1)
    for end in range(1, len(history) + 1):
        assert grown.propose(history[:end], 3) == NgramDrafter(max_n=2, min_n=1).propose(history[:end], 3)


def test_a_negative_draft_count_is_refused(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast
) -> None:
    with pytest.raises(InvalidRequestError, match="speculative_ngram"):
        Engine(llama, tokenizer, speculative_ngram=-1)


# ---- a real (tiny) model: the outputs are plain decoding's -------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen"])
@pytest.mark.parametrize(("max_batch_size", "stagger"), [(1, 0.0), (4, 0.003), (16, 0.0)])
async def test_cpu_greedy_tokens_and_logprobs_equal_plain_decoding(
    arch: str,
    max_batch_size: int,
    stagger: float,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    model = request.getfixturevalue(arch)
    batch = looping_prompts(tokenizer, 10) + prompts(tokenizer, 4)
    # Budgets that end a sequence inside a draft as well as between two.
    requests = [(p, SamplingParams(temperature=0.0, max_tokens=5 + 7 * i % 31)) for i, p in enumerate(batch)]
    plain, fast, stats = await run_both(
        make_engine, model, tokenizer, requests, stagger=stagger, max_batch_size=max_batch_size
    )
    assert_same(plain, fast)
    assert stats["draft_accepted"] > 0 and stats["draft_tokens"] >= stats["draft_accepted"]
    generated = sum(len(o.token_ids) for o in fast)
    assert stats["steps"] < generated  # forwards were saved (a request's first token comes from prefill)


@pytest.mark.parametrize("arch", ["llama", "qwen"])
async def test_cpu_rows_sharing_a_long_prefix_verify_with_cascade_attention(
    arch: str,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    """Agents' prompts: one long system prompt, then each its own question; the verify forward reads
    the shared prefix once for every row and every draft (and a batch that stops sharing it does not)."""
    model = request.getfixturevalue(arch)
    system = [t for p in looping_prompts(tokenizer, 3) for t in p]
    assert len(system) > 100
    batch = [system + p for p in looping_prompts(tokenizer, 8)]
    requests = [(p, SamplingParams(temperature=0.0, max_tokens=12 + 3 * i)) for i, p in enumerate(batch)]
    requests.append((prompts(tokenizer, 1)[0], SamplingParams(temperature=0.0, max_tokens=8)))
    plain, fast, stats = await run_both(make_engine, model, tokenizer, requests, max_batch_size=9)
    assert_same(plain, fast)
    assert stats["draft_accepted"] > 0 and stats["prefix_cached_tokens"] > 0


@pytest.mark.parametrize("family", ["gpt2", "mistral"])
async def test_cpu_the_recompute_runner_and_sliding_windows_speculate_exactly(
    family: str, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """GPT-2 runs on the recompute runner (no cache: it verifies by recomputing); Mistral's sliding
    window of 16 positions masks the verify forward's older keys, with and without a cascade."""
    with torch.random.fork_rng():
        torch.manual_seed(0)
        if family == "gpt2":
            config: Any = GPT2Config(
                vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=512
            )
            model: torch.nn.Module = GPT2LMHeadModel(config)
        else:
            config = MistralConfig(
                vocab_size=len(tokenizer),
                hidden_size=64,
                intermediate_size=128,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                sliding_window=16,
                max_position_embeddings=1024,
            )
            model = MistralForCausalLM(config)
        model = diversify(model.eval(), seed=7)
    system = [t for p in looping_prompts(tokenizer, 3) for t in p]
    batch = looping_prompts(tokenizer, 4) + [system + p for p in looping_prompts(tokenizer, 4)]
    requests = [(p, SamplingParams(temperature=0.0, max_tokens=10 + 3 * i)) for i, p in enumerate(batch)]
    plain, fast, stats = await run_both(make_engine, model, tokenizer, requests, max_batch_size=4)
    assert_same(plain, fast)
    assert stats["draft_accepted"] > 0


async def test_cpu_stop_strings_and_stop_tokens_end_where_they_do_without_drafts(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    batch = looping_prompts(tokenizer, 8)
    plain = [
        await make_engine(llama, tokenizer).generate(p, SamplingParams(temperature=0.0, max_tokens=30))
        for p in batch
    ]
    requests = []
    for i, (prompt, out) in enumerate(zip(batch, plain, strict=True)):
        late = out.token_ids[8 + i % 5]  # a token that occurs after the output has started repeating
        text = tokenizer.decode(out.token_ids[10 + i % 7 : 12 + i % 7]).strip()
        stops = SamplingParams(
            temperature=0.0, max_tokens=30, stop_token_ids=[late], stop=[text] if text else []
        )
        requests.append((prompt, stops))
    before, after, stats = await run_both(make_engine, llama, tokenizer, requests, max_batch_size=8)
    assert_same(before, after)
    assert any(o.finish_reason == "stop" for o in after)
    assert stats["draft_accepted"] > 0


async def test_cpu_seeded_samples_and_shaped_rows_equal_plain_decoding(
    qwen: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """A seeded row draws its noise from its own generator once per token, speculating or not, so its
    sample is the same; penalties and biases see every token taken before each position."""
    batch = looping_prompts(tokenizer, 12)
    settings = [
        {"temperature": 0.3, "seed": 1},
        {"temperature": 0.7, "top_p": 0.9, "seed": 2},
        {"temperature": 0.5, "top_k": 3, "seed": 3},
        {"temperature": 0.0, "frequency_penalty": 0.4, "presence_penalty": 0.2},
        {"temperature": 0.4, "logit_bias": {tokenizer.eos_token_id: -100.0, 5: 2.0}, "seed": 5},
        {"temperature": 0.0, "logit_bias": {tokenizer.eos_token_id: -100.0}},
    ]
    requests = [
        (p, SamplingParams(max_tokens=24, **settings[i % len(settings)]))  # type: ignore[arg-type]
        for i, p in enumerate(batch)
    ]
    plain, fast, stats = await run_both(
        make_engine, qwen, tokenizer, requests, max_batch_size=6, stagger=0.002
    )
    assert_same(plain, fast)
    assert stats["draft_accepted"] > 0


async def test_cpu_a_grammar_sees_every_token_taken_before_each_position(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    grammar = 'start: ("It is " NUMBER ". ")+ "What"\nNUMBER: /[0-9]{1,2}/'
    batch = looping_prompts(tokenizer, 6)
    requests = [(p, SamplingParams(temperature=0.0, max_tokens=30, grammar=grammar)) for p in batch]
    plain, fast, stats = await run_both(make_engine, llama, tokenizer, requests, max_batch_size=6)
    assert_same(plain, fast)
    assert all(o.text.startswith("It is") for o in fast), [o.text for o in fast]
    assert stats["draft_accepted"] > 0


async def test_cpu_streams_get_every_token_once(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    engine = make_engine(llama, tokenizer, speculative_ngram=DRAFTS)
    prompt = looping_prompts(tokenizer, 1)[0]
    params = SamplingParams(temperature=0.0, max_tokens=40)
    streamed: list[int] = []
    final: EngineOutput | None = None
    async for item in engine.stream(prompt, params):
        if isinstance(item, EngineOutput):
            final = item
        else:
            streamed.extend(item.token_ids)
    assert final is not None and streamed == final.token_ids
    assert engine.stats()["draft_accepted"] > 0
    assert engine.stats()["steps"] < len(streamed)


async def test_cpu_adapter_rows_speculate_with_their_adapter(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    base = copy.deepcopy(llama)
    tuned = get_peft_model(
        copy.deepcopy(llama), LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS), "alpha"
    )
    randomize(tuned, "alpha", 1)
    state = adapter_state(tuned, ["alpha"])
    batch = looping_prompts(tokenizer, 6)
    params = SamplingParams(temperature=0.0, max_tokens=20, logit_bias={tokenizer.eos_token_id: -100.0})
    outs = []
    for drafts in (0, DRAFTS):
        engine = make_engine(copy.deepcopy(base), tokenizer, max_batch_size=6, speculative_ngram=drafts)
        await engine.load_weights(state, version=1)
        outs.append(
            await asyncio.gather(
                *(engine.generate(p, params, adapter="alpha" if i % 2 else None) for i, p in enumerate(batch))
            )
        )
        if drafts:
            assert engine.stats()["draft_accepted"] > 0
    assert_same(outs[0], outs[1])


# ---- the acceptance rule on a model whose every step is known --------------------------------------


class TableRunner:
    """A stand-in runner whose next-token logits depend on the last token only (`table[last]`): what
    the engine does with drafts is then checkable exactly and fast."""

    def __init__(self, table: torch.Tensor) -> None:
        self.table = table
        self.verified: list[list[list[int]]] = []

    def prefill(
        self, first_slot: int, prompts: list[list[int]], cached: Any = None, adapters: Any = None
    ) -> torch.Tensor:
        return self.table[[p[-1] for p in prompts]]

    def decode(self, tokens: list[int], positions: list[int], adapters: Any = None) -> torch.Tensor:
        return self.table[tokens]

    def verify(self, feeds: list[list[int]], positions: list[int], adapters: Any = None) -> torch.Tensor:
        self.verified.append(feeds)
        return self.table[[t for fed in feeds for t in fed]]

    def move(self, src: int, dst: int, length: int) -> None:
        pass

    def move_many(self, moves: list[tuple[int, int, int]]) -> None:
        pass

    def refresh_weights(self) -> None:
        pass

    def reserve(self, slots: int, length: int) -> None:
        pass

    def lora_modules(self) -> frozenset[str]:
        return frozenset()

    def slot_capacity(self) -> int:
        return 0

    def set_adapters(self, adapters: Any) -> None:
        pass


def table_engine(
    make_engine: Callable[..., Engine],
    llama: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    table: torch.Tensor,
    **kwargs: Any,
) -> tuple[Engine, TableRunner]:
    engine = make_engine(llama, tokenizer, speculative_ngram=DRAFTS, **kwargs)
    runner = TableRunner(table)
    engine._runner = runner  # the engine's one seam for a model
    return engine, runner


async def test_an_end_of_sequence_inside_an_accepted_draft_ends_the_sequence_there(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    a, b, c, x, y = 10, 11, 12, 13, 14
    table = torch.full((vocab, vocab), -30.0)
    for last, nxt in {y: a, a: b, b: c, c: eos, eos: x}.items():
        table[last, nxt] = 0.0
    engine, runner = table_engine(make_engine, llama, tokenizer, table)
    # The prompt already holds "y a b c EOS x" (a previous turn): after `y a` the drafter proposes b c EOS x.
    out = await engine.generate([y, a, b, c, eos, x, y], SamplingParams(temperature=0.0, max_tokens=20))
    assert out.token_ids == [a, b, c, eos] and out.finish_reason == "stop"
    assert runner.verified == [[[a, b, c, eos, x]]]  # one forward: three drafts kept, then the stop
    assert engine.stats()["draft_accepted"] == 3


async def test_max_tokens_caps_the_drafts(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    vocab = len(tokenizer)
    table = torch.full((vocab, vocab), -30.0)
    for t in range(20, 30):
        table[t, t + 1 if t < 29 else 20] = 0.0
    engine, runner = table_engine(make_engine, llama, tokenizer, table)
    out = await engine.generate(list(range(20, 30)) * 2, SamplingParams(temperature=0.0, max_tokens=4))
    assert out.token_ids == [20, 21, 22, 23] and out.finish_reason == "length"
    # Token 1 from prefill; the step feeds it and at most the 2 drafts that can still be kept.
    assert runner.verified == [[[20, 21, 22]]]


async def test_a_batch_that_fills_the_cheap_rows_gets_no_drafts(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    vocab = len(tokenizer)
    table = torch.full((vocab, vocab), -30.0)
    for t in range(20, 30):
        table[t, t + 1 if t < 29 else 20] = 0.0
    engine, runner = table_engine(make_engine, llama, tokenizer, table, speculative_rows=6)
    params = SamplingParams(temperature=0.0, max_tokens=12)
    outs = await asyncio.gather(*(engine.generate(list(range(20, 30)) * 2, params) for _ in range(3)))
    assert all(o.token_ids == [20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 20, 21] for o in outs)
    # Three rows and three drafts fill the six rows (the first sequence's, on a tie of match lengths).
    assert all(sum(map(len, feeds)) <= 6 for feeds in runner.verified)
    assert runner.verified[0] == [[20, 21, 22, 23], [20], [20]]
    full, runner = table_engine(make_engine, llama, tokenizer, table, speculative_rows=3)
    assert await asyncio.gather(*(full.generate(list(range(20, 30)) * 2, params) for _ in range(3))) == outs
    assert full.stats()["draft_tokens"] == 0 and not runner.verified


async def test_unseeded_samples_follow_the_models_distribution(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    """Drafts that are often right and often wrong: the frequency of every 3-token continuation matches
    the model's probability (a rule that kept drafts too readily, or resampled them, would not)."""
    vocab, eos = len(tokenizer), tokenizer.eos_token_id
    states = [40, 41, 42]
    table = torch.full((vocab, vocab), -1e4)
    probs = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.45, 0.1, 0.45]])
    for i, s in enumerate(states):
        table[s, states] = probs[i].log()
    table[:, eos] = -1e4
    engine, _ = table_engine(
        make_engine, llama, tokenizer, table, max_batch_size=64, speculative_rows=512, seed=0
    )
    prompt = [40, 41, 42, 40, 40, 42, 41, 41, 40, 42, 42, 40, 41]
    samples = 3000
    params = SamplingParams(temperature=1.0, max_tokens=3)
    outs = await asyncio.gather(*(engine.generate(prompt, params) for _ in range(samples)))
    counts = Counter(tuple(o.token_ids) for o in outs)
    expected: dict[tuple[int, ...], float] = {}
    for i in range(3):
        for j in range(3):
            for k in range(3):
                expected[(states[i], states[j], states[k])] = float(probs[1, i] * probs[i, j] * probs[j, k])
    chi2 = sum((counts[key] - samples * p) ** 2 / (samples * p) for key, p in expected.items())
    assert sum(counts.values()) == samples and set(counts) <= set(expected)
    # 26 degrees of freedom: P(chi2 > 60) < 2e-4 for a correct sampler.
    assert chi2 < 60, (chi2, counts)
    assert engine.stats()["draft_accepted"] > samples / 4
    for out in outs:  # and each recorded logprob is the model's
        lp = [
            math.log(float(probs[states.index(a), states.index(b)]))
            for a, b in zip([41, *out.token_ids], out.token_ids, strict=False)
        ]
        assert out.logprobs == pytest.approx(lp, abs=1e-5)
