"""A real store and gateway (scripted backend, real tokenizer) on 127.0.0.1, a real `Runner`, and
credit on what they recorded: the path a framework agent's telemetry takes in training."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from reinforge import semconv
from reinforge.credit import CreditConfig, CreditMetrics, build_transitions
from reinforge.gateway.app import create_gateway_app
from reinforge.inference import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.net.background import BackgroundServer
from reinforge.runner import Runner
from reinforge.store.memory import MemoryStore
from reinforge.types import (
    Attempt,
    AttemptQuery,
    Rollout,
    RolloutSpec,
    RolloutStatus,
    Span,
    SpanQuery,
    Transition,
)

torch.set_num_threads(1)

SECRET = "integration-gateway-secret-" + "i" * 16
CORPUS = [
    "What is 1/0? Let me use the calculator. 6*7 = 42. Retrying with a valid expression.",
    '<tool_call>{"name": "calculator", "arguments": {"expression": "1/0"}}</tool_call>',
    "Draft: the answer is 42. Checked: the draft is correct.",
] * 20

FAILING_CALL = ScriptedReply(
    tool_calls=[ScriptedToolCall(name="calculator", arguments={"expression": "1/0"})]
)
"""The first reply everywhere: a calculator call whose tool raises ZeroDivisionError."""
ANSWER = "6*7 = 42."
AIR = CreditConfig(assignment="equal+air")


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from reinforge.models import build_tokenizer

    return build_tokenizer(CORPUS, vocab_size=400)


@dataclass
class Stack:
    store: MemoryStore
    backend: ScriptedBackend
    gateway_url: str


@pytest.fixture
def serve(tokenizer: Any) -> Iterator[Any]:
    """`serve(replies)`: a gateway whose scripted backend answers `replies` in order."""
    servers: list[BackgroundServer] = []

    def start(replies: Sequence[str | ScriptedReply]) -> Stack:
        store = MemoryStore()
        backend = ScriptedBackend(tokenizer, list(replies))
        server = BackgroundServer(create_gateway_app(store, backend, SECRET))
        servers.append(server)
        return Stack(store=store, backend=backend, gateway_url=server.start().url)

    yield start
    for server in servers:
        server.stop()


@dataclass
class Run:
    """One rollout run by the runner: the rollout, its attempt records and its spans."""

    rollout: Rollout
    attempts: list[Attempt]
    spans: list[Span]

    def steps(self, kind: str) -> list[Span]:
        """Spans of one step kind, in start order."""
        found = [s for s in self.spans if s.attributes.get(semconv.ATTR_STEP_KIND) == kind]
        return sorted(found, key=lambda s: s.start_time)

    def credit(self, config: CreditConfig = AIR) -> tuple[list[Transition], CreditMetrics]:
        return build_transitions(self.rollout, self.spans, config, attempts=self.attempts)


async def run_one(stack: Stack, agent: Any, *, instrument_frameworks: bool = True) -> Run:
    """Run `agent` on one rollout with a real runner, then read back what the store holds."""
    (rollout,) = await stack.store.enqueue_rollouts([RolloutSpec(task={"question": "what is 1/0?"})])
    runner = Runner(
        stack.store,
        agent,
        stack.gateway_url,
        SECRET,
        timeout_s=60,
        instrument_frameworks=instrument_frameworks,
    )
    stats = await runner.run(max_rollouts=1)
    assert (stats.succeeded, stats.errors) == (1, []), stats
    (final,) = await stack.store.wait_for_rollouts([rollout.rollout_id], 10.0)
    assert final.status == RolloutStatus.succeeded
    attempts = (await stack.store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
    spans = (await stack.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=1000))).items
    return Run(final, list(attempts), list(spans))
