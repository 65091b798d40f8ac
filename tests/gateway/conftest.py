"""Shared pieces of the gateway tests: a real tokenizer, a real store, a served gateway."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import pytest
import torch

from reinforge.access import attempt_token
from reinforge.gateway import create_gateway_app
from reinforge.inference import ScriptedBackend
from reinforge.models import build_tokenizer
from reinforge.net.background import BackgroundServer
from reinforge.store.memory import MemoryStore
from reinforge.types import AttemptOutcome, AttemptStatus, LeasedRollout, RolloutSpec

torch.set_num_threads(1)

SECRET = "test-gateway-secret"
CORPUS = [
    "What is 2+3? The answer is 5. Let me use the calculator tool for that.",
    "Hello there, how are you today? I am fine, thank you very much.",
    '{"name": "calc", "arguments": {"expression": "2+3"}}',
] * 20


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    return build_tokenizer(CORPUS, vocab_size=400)


@dataclass
class Served:
    url: str
    store: MemoryStore
    backend: ScriptedBackend
    app: Any

    @property
    def gateway(self) -> Any:
        return self.app.state.gateway

    def client(self, attempt_id: str, agent: str | None = None) -> openai.AsyncOpenAI:
        base = f"{self.url}/r/{attempt_id}" + (f"/agents/{agent}" if agent else "") + "/v1"
        return openai.AsyncOpenAI(base_url=base, api_key=attempt_token(SECRET, attempt_id), max_retries=0)

    def headers(self, attempt_id: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {attempt_token(SECRET, attempt_id)}"}


async def running_attempt(store: MemoryStore, task: dict[str, Any] | None = None) -> LeasedRollout:
    await store.enqueue_rollouts([RolloutSpec(task=task or {"q": "2+3"})])
    leased = await store.lease_rollouts("test-runner", max_rollouts=1)
    assert len(leased) == 1 and leased[0].attempt.status is AttemptStatus.running
    return leased[0]


async def finished_attempt(store: MemoryStore) -> LeasedRollout:
    leased = await running_attempt(store)
    await store.finish_attempt(
        leased.attempt.attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1)
    )
    return leased


def serve(backend: ScriptedBackend, **options: Any) -> Iterator[Served]:
    store = MemoryStore()
    app = create_gateway_app(store, backend, SECRET, **options)
    with BackgroundServer(app) as server:
        yield Served(server.url, store, backend, app)


@pytest.fixture
def served(tokenizer: Any) -> Iterator[Served]:
    backend = ScriptedBackend(tokenizer, ["The answer is 5."])
    yield from serve(backend)
