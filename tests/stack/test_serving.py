"""The served stack as a user gets it: each backend kind built from `EngineSettings` by
`build_serving`, behind the gateway mounted on the store server (`StackApp` on a `ServedStack`) on
127.0.0.1, answered over HTTP; and the settings' refusals."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import torch

from gateway.conftest import running_attempt
from inference.fake_servers import FakeVllm
from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.engine.engine_backend import EngineBackend
from reinforge.errors import InvalidRequestError
from reinforge.inference.scripted import ScriptedBackend
from reinforge.inference.upstream import UpstreamBackend
from reinforge.models import build_tokenizer, tiny_llama
from reinforge.net.background import BackgroundServer
from reinforge.stack.app import GATEWAY_MOUNT, ServedStack, StackApp
from reinforge.stack.backends import NO_MODEL_HINT, Serving, build_serving
from reinforge.stack.settings import MODEL_NAME, EngineSettings
from reinforge.stack.weight_sync import EmbeddedEngineSync, VllmWeightSync
from reinforge.store.memory import MemoryStore
from reinforge.types import SpanQuery

torch.set_num_threads(1)

CORPUS = ["What is 2+3? The answer is 5.", "Hello there, how are you today? I am fine."] * 20


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return build_tokenizer(CORPUS, vocab_size=300)


def tiny_model(tokenizer: Any) -> Any:
    return tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@asynccontextmanager
async def served(serving: Serving) -> AsyncIterator[tuple[ServedStack, MemoryStore]]:
    store = MemoryStore()
    await serving.start()
    stack = ServedStack(StackApp(store, serving.backend))
    await stack.start()
    try:
        yield stack, store
    finally:
        await stack.stop()
        await serving.aclose()


async def ask(stack: ServedStack, store: MemoryStore, question: str = "What is 2+3?") -> tuple[str, str]:
    """One chat call through the gateway, as an agent makes it: (the reply, the attempt id)."""
    attempt = (await running_attempt(store)).attempt.attempt_id
    client = openai.AsyncOpenAI(
        base_url=f"{stack.gateway_url}/r/{attempt}/v1",
        api_key=attempt_token(stack.stack.gateway_secret, attempt),
        max_retries=0,
    )
    try:
        response = await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": question}], max_tokens=5
        )
    finally:
        await client.close()
    return response.choices[0].message.content or "", attempt


async def recorded_completion_ids(stack: ServedStack, store: MemoryStore, attempt: str) -> list[int]:
    await stack.gateway.flush()
    spans = (await store.query_spans(SpanQuery(attempt_id=attempt))).items
    (llm,) = [s for s in spans if semconv.ATTR_COMPLETION_TOKEN_IDS in s.attributes]
    return list(llm.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS])


async def test_the_embedded_engine_serves_a_model_folder(tokenizer: Any, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    tiny_model(tokenizer).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    settings = EngineSettings(model_dir=folder, max_batch_size=4, max_seq_len=128, speculative_ngram=3)
    serving = build_serving(settings)
    assert isinstance(serving.backend, EngineBackend) and serving.engine is not None
    assert serving.engine.speculative_ngram == 3
    assert isinstance(serving.weight_sync, EmbeddedEngineSync)
    async with served(serving) as (stack, store):
        _, attempt = await ask(stack, store)
        ids = await recorded_completion_ids(stack, store, attempt)
        assert 1 <= len(ids) <= 5  # the engine's own tokens, recorded by the gateway


async def test_the_embedded_engine_refuses_a_folder_without_a_model(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match=r"has no config\.json"):
        build_serving(EngineSettings(model_dir=tmp_path))
    with pytest.raises(InvalidRequestError, match="needs a model"):
        build_serving(EngineSettings())


async def test_scripted_replies_answer_in_turn_and_the_store_route_answers(tmp_path: Path) -> None:
    replies = tmp_path / "replies.json"
    replies.write_text(json.dumps(["first reply", {"text": "second reply"}]))
    serving = build_serving(EngineSettings(backend="scripted", scripted=replies))
    assert isinstance(serving.backend, ScriptedBackend) and serving.weight_sync is None
    async with served(serving) as (stack, store):
        assert [(await ask(stack, store))[0] for _ in range(2)] == ["first reply", "second reply"]
        headers = {"Authorization": f"Bearer {stack.stack.store_token}"}
        async with httpx.AsyncClient() as http:
            counters = (await http.get(stack.url + "/store/counters", headers=headers)).json()
            unauthorised = await http.get(stack.url + "/store/counters")
    assert counters["rollouts_by_status"] == {"running": 2} and unauthorised.status_code == 401


async def test_an_upstream_server_answers_through_the_gateway(tokenizer: Any, tmp_path: Path) -> None:
    model = tiny_model(tokenizer)
    fake = FakeVllm(model, tokenizer)
    with BackgroundServer(fake.app()) as upstream:
        serving = build_serving(EngineSettings(backend="vllm", url=upstream.url), tokenizer=tokenizer)
        assert isinstance(serving.backend, UpstreamBackend) and serving.weight_sync is None
        async with served(serving) as (stack, store):
            _, attempt = await ask(stack, store)
            ids = await recorded_completion_ids(stack, store, attempt)
        assert [body["model"] for path, body in fake.requests if path == "/v1/chat/completions"] == [
            MODEL_NAME
        ]
        assert len(ids) >= 1
        # Given the model and a weights folder, the same settings can also take trained weights.
        synced = EngineSettings(backend="vllm", url=upstream.url, weights_dir=tmp_path / "weights")
        trained = build_serving(synced, model, tokenizer)
        assert isinstance(trained.weight_sync, VllmWeightSync)
        await trained.aclose()


async def test_no_model_answers_503_saying_how_to_give_one() -> None:
    async with served(build_serving(EngineSettings(backend="none"))) as (stack, store):
        with pytest.raises(openai.APIStatusError) as refused:
            await ask(stack, store)
    assert refused.value.status_code == 503
    assert NO_MODEL_HINT in str(refused.value)
    assert GATEWAY_MOUNT == "/gateway" and stack.gateway_url.endswith("/gateway")


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"backend": "vllm"}, r"needs \['url'\]"),
        ({"backend": "scripted"}, r"goes with engine.backend = 'scripted'"),
        ({"scripted": "r.json"}, r"goes with engine.backend = 'scripted'"),
        ({"backend": "none", "max_seq_len": 64}, r"\['max_seq_len'\] are the embedded engine's"),
        ({"backend": "none", "speculative_ngram": 4}, r"\['speculative_ngram'\] are the embedded engine's"),
        ({"backend": "sglang", "url": "http://h:1", "model_dir": "m"}, r"\['model_dir'\] are the embedded"),
        ({"url": "http://h:1"}, r"are for backend 'vllm' or 'sglang'"),
        ({"backend": "vllm", "url": "http://h:1", "weights_dir": "w"}, r"must be an absolute path"),
    ],
)
def test_settings_refuse_what_the_backend_cannot_honour(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        EngineSettings.model_validate(settings)
