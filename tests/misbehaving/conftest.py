"""One store server with the gateway mounted beside it (scripted backend, a real tokenizer), as a
trainer serves them, and a Runner running one misbehaving rollout among well-behaved ones."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from reinforge.gateway.app import create_gateway_app
from reinforge.gateway.service import Gateway
from reinforge.inference.scripted import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import Rollout, RolloutSpec

torch.set_num_threads(1)

GATEWAY_SECRET = "gateway-secret-" + "m" * 20
STORE_TOKEN = "store-token-" + "m" * 20
GOOD_ROLLOUTS = 3
"""Well-behaved rollouts run beside each misbehaving one; every one of them must succeed."""


@dataclass
class Stack:
    store: MemoryStore
    gateway: Gateway
    server: BackgroundServer

    @property
    def gateway_url(self) -> str:
        return self.server.url + "/gateway"


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from reinforge.models import build_tokenizer

    corpus = ["The answer is 4.", "what is 2 + 2?", "hello world"] * 20
    return build_tokenizer(corpus, vocab_size=300)


@contextmanager
def serve_stack(
    tokenizer: Any, *, max_calls_per_attempt: int = 10_000, generation_s: float = 0.0
) -> Iterator[Stack]:
    """`generation_s`: how long each scripted generation takes (a stream spreads it over its tokens)."""
    store = MemoryStore()
    backend = ScriptedBackend(tokenizer, ["The answer is 4."], delay_s=generation_s)
    app = create_store_app(store, STORE_TOKEN)
    gateway_app = create_gateway_app(
        store, backend, GATEWAY_SECRET, max_calls_per_attempt=max_calls_per_attempt
    )
    app.mount("/gateway", gateway_app)
    with BackgroundServer(app) as server:
        yield Stack(store=store, gateway=gateway_app.state.gateway, server=server)


async def enqueue(store: MemoryStore, bad: dict[str, Any]) -> tuple[Rollout, list[Rollout]]:
    """The misbehaving rollout and `GOOD_ROLLOUTS` good ones, enqueued together (one try each)."""
    specs = [RolloutSpec(task=bad, max_attempts=1)]
    specs += [RolloutSpec(task={"kind": "good", "n": i}, max_attempts=1) for i in range(GOOD_ROLLOUTS)]
    rollouts = await store.enqueue_rollouts(specs)
    return rollouts[0], rollouts[1:]


async def final(store: MemoryStore, rollouts: list[Rollout], timeout: float = 30.0) -> list[Rollout]:
    ids = [r.rollout_id for r in rollouts]
    done = await store.wait_for_rollouts(ids, timeout)
    assert len(done) == len(ids), f"only {len(done)} of {len(ids)} rollouts finished in {timeout}s"
    by_id = {r.rollout_id: r for r in done}
    return [by_id[i] for i in ids]


async def until_idle(gateway: Gateway, timeout: float = 10.0) -> None:
    """The gateway has no call in flight and no stream open (a dropped stream left nothing behind)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while gateway.in_flight or gateway.open_streams:
        assert asyncio.get_running_loop().time() < deadline, (
            f"{gateway.in_flight} calls still in flight, {gateway.open_streams} streams open"
        )
        await asyncio.sleep(0.02)


def open_fds() -> int:
    """File descriptors this process holds (the test's server and clients all live in it)."""
    return len(os.listdir("/proc/self/fd"))
