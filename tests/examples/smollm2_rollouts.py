"""One agent's rollouts on the real SmolLM2-135M-Instruct: the embedded engine behind a real gateway,
the model's own tokenizer and ChatML template, a runner, and the credit figures of what was recorded.

Shared by the examples' `test_*_smollm2.py` files: each runs its config's agent on one or two tasks
with tiny generation limits, so a test costs seconds beyond the session's one conversion."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.gateway.app import create_gateway_app
from reinforge.inference.run_sampling import RunSampling
from reinforge.net.background import BackgroundServer
from reinforge.runner import Runner
from reinforge.store.memory import MemoryStore
from reinforge.training.rollouts import attempt_resources
from reinforge.types import AttemptQuery, Rollout, RolloutSpec, SpanQuery

SMOLLM2 = "smollm2-135m-instruct"
SECRET = "smollm2-examples-gateway-secret-" + "s" * 16


@dataclass
class Recorded:
    """What one rollout left in the store, and how credit assignment reads it."""

    rollout: Rollout
    prompts: list[str]
    """Every call's prompt as the model saw it (rendered by its chat template)."""
    agent_names: list[str]
    calls: int
    transitions: int
    merged_calls: int
    merge_mismatches: int


async def run_on_smollm2(
    cache: Path, agent: Any, tasks: list[dict[str, Any]], credit: CreditConfig, *, max_tokens: int
) -> list[Recorded]:
    """Run `agent` once per task on the real model (sampled, `max_tokens` a call), all at once."""
    folder = cache / SMOLLM2
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    store = MemoryStore()
    with Engine(model, tokenizer, max_batch_size=8, max_seq_len=1536, seed=0) as engine:
        backend = EngineBackend(engine, tokenizer)
        server = BackgroundServer(create_gateway_app(store, backend, SECRET))
        url = server.start().url
        try:
            sampling = RunSampling(temperature=1.0, max_tokens=max_tokens)
            version = await store.put_resources(attempt_resources(0, sampling))
            specs = [RolloutSpec(task=t, resources_version=version.version) for t in tasks]
            rollouts = await store.enqueue_rollouts(specs)
            runner = Runner(store, agent, url, SECRET, timeout_s=120, concurrency=len(tasks))
            stats = await runner.run(max_rollouts=len(tasks))
            assert stats.errors == []
            finished = await store.wait_for_rollouts([r.rollout_id for r in rollouts], 10.0)
        finally:
            server.stop()
    recorded: list[Recorded] = []
    for rollout in finished:
        attempts = (await store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
        spans = (await store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=200))).items
        _, metrics = build_transitions(rollout, spans, credit, attempts=attempts)
        calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        recorded.append(
            Recorded(
                rollout=rollout,
                prompts=[
                    tokenizer.decode(list(s.attributes.get(semconv.ATTR_PROMPT_TOKEN_IDS) or []))
                    for s in calls
                ],
                agent_names=[str(s.attributes.get(semconv.ATTR_AGENT_NAME, "")) for s in calls],
                calls=metrics.calls,
                transitions=metrics.transitions,
                merged_calls=metrics.merged_calls,
                merge_mismatches=metrics.merge_mismatches,
            )
        )
    return recorded


@dataclass
class RecordedTraces:
    """`reinforge sft`'s recording step for one config: what the store holds and how it reads."""

    store: MemoryStore
    tokenizer: Any
    mean_reward: float
    rewards: dict[str, float]
    """Each recorded rollout's reward, by its task's question."""


async def record_warm_start(cfg: Any, cache: Path, tasks: list[dict[str, Any]]) -> RecordedTraces:
    """The config's unchanged agent on `tasks`, each call answered by its `[warm_start] policy` through
    a `ScriptedBackend` with SmolLM2's real tokenizer, recorded as `reinforge sft` records; every
    rollout must succeed."""
    from reinforge.inference.scripted import ScriptedBackend
    from reinforge.stack.settings import MODEL_NAME
    from reinforge.training.collect import collect_traces, recorded_rollouts
    from reinforge.training.run_config import load_callable, resolve_agent

    ws = cfg.warm_start
    assert ws is not None and ws.policy is not None
    tokenizer = AutoTokenizer.from_pretrained(cache / SMOLLM2)
    policy = load_callable(ws.policy, cfg.base_dir, what="policy")
    store = MemoryStore()
    backend = ScriptedBackend(tokenizer, policy, model_name=MODEL_NAME, compact_json=ws.compact_json)
    report = await collect_traces(
        resolve_agent(cfg), tasks, backend, store, concurrency=12, max_tokens=ws.max_tokens
    )
    assert report.rollouts == report.succeeded == len(tasks)
    rewards = {str(r.task["question"]): r.reward for r in await recorded_rollouts(store)}
    return RecordedTraces(store, tokenizer, report.mean_reward, rewards)
