"""The pieces the vLLM and SGLang weight-sync tests share: a rollout stack fronting a fake server
(no runners: the tests make the calls themselves, through the gateway over HTTP), a policy to sync,
calls fired while syncs run, and the checks that no answer mixed versions."""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import openai
import torch

from gateway.conftest import running_attempt
from inference.fake_servers import FakeServer
from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.algorithms import GRPO
from reinforge.net.background import BackgroundServer
from reinforge.stack.settings import MODEL_NAME, EngineSettings
from reinforge.store.memory import MemoryStore
from reinforge.training.config import LoraSettings, OptimSettings
from reinforge.training.policy import Policy
from reinforge.training.rollout_stack import RolloutStack
from reinforge.types import SpanQuery

LORA = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])


def make_policy(model: Any, tokenizer: Any, lora: bool = False) -> Policy:
    optim = OptimSettings(learning_rate=1e-2, lora=LORA if lora else None)
    return Policy(copy.deepcopy(model), GRPO(group_size=2), optim, pad_token_id=int(tokenizer.pad_token_id))


def nudge(policy: Policy, seed: int) -> None:
    """Move the trainable weights, as an update would (a LoRA B starts at zero: nudging makes the
    adapter change the output)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.model.parameters():
            if p.requires_grad:
                p.add_(torch.randn(p.shape, generator=gen) * 0.05)


@asynccontextmanager
async def stack_on(
    fake: FakeServer, model: Any, tokenizer: Any, run_dir: Path, **engine: Any
) -> AsyncIterator[tuple[RolloutStack, MemoryStore]]:
    """A served fake, and a rollout stack (store server + gateway) whose backend is that server."""
    store = MemoryStore()
    with BackgroundServer(fake.app()) as upstream:
        settings = EngineSettings(url=upstream.url, weights_dir=run_dir / "weights", **engine)
        stack = RolloutStack(store, model, tokenizer, run_dir, settings)
        await stack.weight_sync.check()
        await stack.served.start()
        try:
            yield stack, store
        finally:
            await stack.stop()


async def call(stack: RolloutStack, store: MemoryStore, question: str, max_tokens: int = 8) -> int:
    """One chat call through the gateway, as an agent makes it; returns the completion length."""
    leased = await running_attempt(store, {"q": question})
    attempt = leased.attempt.attempt_id
    client = openai.AsyncOpenAI(
        base_url=f"{stack.gateway_url}/r/{attempt}/v1",
        api_key=attempt_token(stack.gateway_secret, attempt),
        max_retries=0,
    )
    try:
        response = await client.chat.completions.create(
            model=MODEL_NAME, messages=[{"role": "user", "content": question}], max_tokens=max_tokens
        )
        return len(response.choices[0].message.content or "")
    finally:
        await client.close()


async def calls_during(
    stack: RolloutStack, store: MemoryStore, syncs: Callable[[], Any], *, streams: int = 6
) -> None:
    """Keep `streams` agents calling back to back while `syncs()` runs, then one more round."""
    done = asyncio.Event()

    async def agent(i: int) -> None:
        n = 0
        while not done.is_set():
            await call(stack, store, f"{i}+{n}")
            n += 1

    agents = [asyncio.create_task(agent(i)) for i in range(streams)]
    try:
        while stack.gateway.calls < streams:  # calls answered, and more in flight, before the syncs
            await asyncio.sleep(0.01)
        await syncs()
    finally:
        done.set()
        await asyncio.gather(*agents)
    await asyncio.gather(*(call(stack, store, f"after {i}") for i in range(streams)))


async def span_versions(stack: RolloutStack, store: MemoryStore) -> Counter[int]:
    """How many recorded LLM calls each policy version answered."""
    await stack.gateway.flush()
    spans = (await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1000))).items
    return Counter(int(s.attributes[semconv.ATTR_POLICY_VERSION]) for s in spans)


def assert_one_version_per_call(
    fake: FakeServer, version_of_tag: Callable[[str], int], spans: Counter[int]
) -> None:
    """Every call the server answered used one set of weights, none ran during a sync call, and the
    versions the gateway recorded are exactly the weights that answered."""
    tags = fake.served_tags()
    assert "MIXED" not in tags
    assert fake.overlaps() == []
    assert Counter(version_of_tag(t) for t in tags) == spans


def merged(policy: Policy) -> Any:
    """The LoRA policy's weights with its adapter merged in: what a server serving it computes with."""
    peft_model: Any = copy.deepcopy(policy.model)
    return peft_model.merge_and_unload()


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.allclose(sa[k], sb[k]) for k in sa)
