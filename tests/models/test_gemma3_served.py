"""Gemma 3 270M, a second real family, served end to end: the packaged GGUF (4/5-bit chunks assembled
by its package) converted into the cache, served by `reinforge store serve --model-dir gemma3-270m` on
the engine's fast path, and called through the gateway as an agent calls it. It is a base model: a
text prompt is answered exactly as Hugging Face's greedy `generate` answers it and recorded with its
token ids; a chat request is refused with a message that names what is missing (a chat template)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.models import MODELS_DIR_ENV_VAR, resolve_model
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import RolloutSpec, Span, SpanQuery
from store.http.served import ServedStore

GEMMA = "gemma3-270m"
PROMPT = "The capital of France is"
NEW_TOKENS = 12


@pytest.fixture(scope="module")
def gemma_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A models cache holding the converted Gemma 3 270M (the `[models-gemma]` extra's package)."""
    cache = tmp_path_factory.mktemp("gemma-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(MODELS_DIR_ENV_VAR, str(cache))
        folder = Path(resolve_model(GEMMA))
    assert folder.parent == cache
    yield cache


def _hf_greedy(folder: Path) -> tuple[list[int], list[int], str]:
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    prompt = list(tokenizer(PROMPT)["input_ids"])
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
        )
    completion = [int(t) for t in out[0, len(prompt) :]]
    return prompt, completion, tokenizer.decode(completion)


def test_gemma3_is_converted_as_its_family(gemma_cache: Path) -> None:
    config = (gemma_cache / GEMMA / "config.json").read_text()
    assert '"model_type": "gemma3_text"' in config
    assert not (gemma_cache / GEMMA / "chat_template.jinja").exists()  # the packaged file has none


def test_gemma3_served_through_the_gateway_equals_hf_and_refuses_chat(
    gemma_cache: Path, tmp_path: Path
) -> None:
    prompt_ids, expected_ids, expected_text = _hf_greedy(gemma_cache / GEMMA)
    run = tmp_path / "run"
    run.mkdir()
    served = ServedStore(
        run,
        db="memory://",
        env={MODELS_DIR_ENV_VAR: str(gemma_cache)},
        options=["--model-dir", GEMMA, "--max-batch-size", "4", "--max-seq-len", "256"],
    )
    try:

        async def calls() -> tuple[str, str, list[Span]]:
            async with HttpStoreClient(served.url, served.token) as client:
                await client.enqueue_rollouts([RolloutSpec(task={"q": "capital"})])
                (leased,) = await client.lease_rollouts("test-runner", max_rollouts=1)
                attempt = leased.attempt.attempt_id
                secret = (run / "gateway.secret").read_text().strip()
                agent = openai.AsyncOpenAI(
                    base_url=f"{served.url}/gateway/r/{attempt}/v1",
                    api_key=attempt_token(secret, attempt),
                    max_retries=0,
                )
                try:
                    answer = await agent.completions.create(
                        model="reinforge-policy", prompt=PROMPT, max_tokens=NEW_TOKENS, temperature=0.0
                    )
                    with pytest.raises(openai.BadRequestError) as refused:
                        await agent.chat.completions.create(
                            model="reinforge-policy",
                            messages=[{"role": "user", "content": "hi"}],
                            max_tokens=4,
                        )
                finally:
                    await agent.close()
                spans: list[Span] = []
                for _ in range(100):  # the gateway's recorder writes spans in batches
                    query = SpanQuery(attempt_id=attempt, name=semconv.SPAN_LLM_CALL)
                    spans = (await client.query_spans(query)).items
                    if spans:
                        break
                    await asyncio.sleep(0.1)
            return answer.choices[0].text, str(refused.value), spans

        text, refusal, spans = asyncio.run(calls())
    finally:
        served.terminate()
    assert text == expected_text
    assert "no chat template" in refusal and "send a prompt" in refusal
    [span] = spans
    assert span.attributes[semconv.ATTR_PROMPT_TOKEN_IDS] == prompt_ids
    assert span.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS] == expected_ids
    assert len(span.attributes[semconv.ATTR_COMPLETION_LOGPROBS]) == NEW_TOKENS
