"""Fixtures: a tokenizer trained on the calc task's text and tiny models that sample varied text."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from openai import AsyncOpenAI
from transformers import PreTrainedTokenizerFast

from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.tasks import generate_tasks
from reinforge.demo.traces import corpus_text, synthetic_traces
from reinforge.models import build_tokenizer, tiny_llama
from reinforge.runner import LLM, agent

torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer() -> PreTrainedTokenizerFast:
    traces = synthetic_traces(generate_tasks("train", 300, seed=0))
    return build_tokenizer(corpus_text(traces, [CALCULATOR_TOOL]), vocab_size=300)


def small_model(tokenizer: PreTrainedTokenizerFast, seed: int = 0) -> Any:
    """A 2-layer Llama whose weights are scaled up so sampling gives varied tokens (and rewards)."""
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=gen)
    return model


@agent(name="parity")
async def parity_agent(task: dict[str, Any], llm: LLM) -> float:
    """Reward 1 when the reply has an even number of characters: random enough to give every GRPO
    group both outcomes, so a few steps always move the weights."""
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    try:
        sampling = llm.resources.get("sampling", {})
        response = await client.chat.completions.create(
            model=llm.model,
            messages=[{"role": "user", "content": str(task["question"])}],
            temperature=float(sampling.get("temperature", 1.0)),
            max_tokens=6,
        )
        return float(len(response.choices[0].message.content or "") % 2 == 0)
    finally:
        await client.close()
