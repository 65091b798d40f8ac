"""Fixtures: a real store, and the real gateway (scripted backend, real tokenizer) mounted beside the
store server on 127.0.0.1, the way a trainer serves them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from reinforge.gateway.app import create_gateway_app
from reinforge.inference.scripted import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.http.client import HttpStoreClient
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import Rollout, RolloutSpec

torch.set_num_threads(1)

GATEWAY_SECRET = "gateway-secret-" + "g" * 20
STORE_TOKEN = "store-token-" + "s" * 20
REPLIES = ["The answer is 4.", "Let me check: 2 + 2 = 4."]


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from reinforge.models import build_tokenizer

    corpus = ["The answer is 4.", "Let me check: 2 + 2 = 4.", "what is 2 + 2?", "hello world"] * 20
    return build_tokenizer(corpus, vocab_size=300)


@dataclass
class Stack:
    """A store server with the gateway mounted at /gateway, sharing one MemoryStore."""

    store: MemoryStore
    backend: ScriptedBackend
    server: BackgroundServer

    @property
    def store_url(self) -> str:
        return self.server.url

    @property
    def gateway_url(self) -> str:
        return self.server.url + "/gateway"


@pytest.fixture
def stack(tokenizer: Any) -> Iterator[Stack]:
    store = MemoryStore()
    backend = ScriptedBackend(tokenizer, REPLIES)
    app = create_store_app(store, STORE_TOKEN)
    app.mount("/gateway", create_gateway_app(store, backend, GATEWAY_SECRET))
    with BackgroundServer(app) as server:
        yield Stack(store=store, backend=backend, server=server)


@pytest.fixture
async def http_store(stack: Stack) -> AsyncIterator[HttpStoreClient]:
    client = HttpStoreClient(stack.store_url, STORE_TOKEN)
    yield client
    await client.close()


async def enqueue(store: Any, *tasks: dict[str, Any], max_attempts: int = 3, **kw: Any) -> list[Rollout]:
    return list(
        await store.enqueue_rollouts([RolloutSpec(task=t, max_attempts=max_attempts, **kw) for t in tasks])
    )


async def wait_final(store: Any, rollouts: list[Rollout], timeout: float = 30.0) -> list[Rollout]:
    ids = [r.rollout_id for r in rollouts]
    final = await store.wait_for_rollouts(ids, timeout)
    assert len(final) == len(ids), f"only {len(final)} of {len(ids)} rollouts finished in {timeout}s"
    by_id = {r.rollout_id: r for r in final}
    return [by_id[i] for i in ids]


async def until(predicate: Any, timeout: float = 10.0) -> None:
    """Poll a cheap async predicate (tests only: production code waits on events)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.02)
