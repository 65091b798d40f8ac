"""The gateway over the embedded engine and a real tiny model: the recorded ids and logprobs are the
engine's, and the logprobs match a teacher-forced forward pass of the same weights."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gateway.conftest import running_attempt, serve
from reinforge import semconv
from reinforge.engine.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.models import tiny_llama
from reinforge.types import SpanQuery

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    return tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)


async def test_engine_calls_are_recorded_with_the_engines_ids(tokenizer: Any, model: Any) -> None:
    with Engine(model, tokenizer, max_batch_size=4, seed=0, max_seq_len=256) as engine:
        for served in serve(EngineBackend(engine, tokenizer)):  # type: ignore[arg-type]
            attempt_id = (await running_attempt(served.store)).attempt.attempt_id
            client = served.client(attempt_id)
            messages = [{"role": "user", "content": "What is 2+3?"}]
            reply = await client.chat.completions.create(
                model="policy",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=12,
                temperature=1.0,
                logprobs=True,
                extra_body={"return_token_ids": True},
            )
            stream = await client.chat.completions.create(
                model="policy",
                messages=messages,  # type: ignore[arg-type]
                max_tokens=12,
                stream=True,
            )
            streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
            await served.gateway.flush(attempt_id)
            spans = (await served.store.query_spans(SpanQuery(attempt_id=attempt_id))).items
    assert len(spans) == 2
    first = spans[0].attributes
    extra = reply.choices[0].model_extra or {}
    assert first[semconv.ATTR_COMPLETION_TOKEN_IDS] == extra["token_ids"]
    assert reply.choices[0].logprobs is not None and reply.choices[0].logprobs.content is not None
    assert first[semconv.ATTR_COMPLETION_LOGPROBS] == [t.logprob for t in reply.choices[0].logprobs.content]
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert first[semconv.ATTR_PROMPT_TOKEN_IDS] == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert streamed == spans[1].attributes[semconv.ATTR_LLM_RESPONSE]["choices"][0]["message"]["content"]

    # Teacher forcing with the same weights gives back the behaviour logprobs the gateway recorded.
    prompt, completion = first[semconv.ATTR_PROMPT_TOKEN_IDS], first[semconv.ATTR_COMPLETION_TOKEN_IDS]
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
    expected = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(completion)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(first[semconv.ATTR_COMPLETION_LOGPROBS]), atol=1e-3)
