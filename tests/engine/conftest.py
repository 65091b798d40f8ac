"""Shared fixtures: a locally trained tokenizer and tiny Llama/Qwen2 models with varied outputs."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine
from reinforge.models import build_tokenizer, tiny_llama, tiny_qwen2

torch.set_num_threads(1)

CORPUS = [f"What is {a} plus {b}? It is {a + b}." for a in range(40) for b in range(25)]


def diversify(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Re-draw the matrices with a larger scale: a freshly initialised tiny model repeats one token,
    which would make "equals HF token for token" a weak check; these produce varied text."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.1, generator=gen)
    return model


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="session")
def llama(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    return diversify(tiny_llama(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128), seed=1)


@pytest.fixture(scope="session")
def qwen(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    # Grouped-query attention (4 heads, 2 KV heads) and q/k/v biases exercise the other code paths.
    model = tiny_qwen2(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, num_kv_heads=2)
    return diversify(model, seed=2)


@pytest.fixture
async def make_engine() -> AsyncIterator[Callable[..., Engine]]:
    """Engines built by a test are stopped when it ends, whatever happens."""
    engines: list[Engine] = []

    def make(model: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, **kwargs: object) -> Engine:
        engine = Engine(model, tokenizer, **kwargs)  # type: ignore[arg-type]
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.stop()


def prompts(tokenizer: PreTrainedTokenizerFast, count: int) -> list[list[int]]:
    """Prompts of varied lengths (a few tokens to a few dozen)."""
    out = []
    for i in range(count):
        text = f"What is {i} plus {i * 7 % 13}?" + " It is" * (i % 5) * 3
        out.append([tokenizer.bos_token_id, *tokenizer(text)["input_ids"]])
    return out


def hf_greedy(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos: int) -> list[int]:
    """HF generate on one unpadded prompt: the reference the engine must equal token for token."""
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos,
            pad_token_id=eos,
        )
    return [int(t) for t in out[0, len(prompt) :]]


@pytest.fixture(scope="session")
def endless(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    """A model that never emits EOS (its head gets a -1e4 bias there): requests run until their
    budget or a cancellation, which the scheduling tests need."""
    model = diversify(tiny_llama(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128), seed=3)
    head = torch.nn.Linear(64, len(tokenizer), bias=True)
    with torch.no_grad():
        head.weight.copy_(model.get_input_embeddings().weight)
        head.bias.zero_()
        head.bias[tokenizer.eos_token_id] = -1e4
    model.lm_head = head
    model.config.tie_word_embeddings = False
    return model
