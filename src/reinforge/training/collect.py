"""Record an agent's conversations against any policy, then turn recorded conversations into SFT data.

A warm start should teach a model the prompts its agent's framework really renders, token for token.
The reliable way is to run the unchanged agent through the gateway against a policy that already
behaves (a scripted one, or a stronger model), let the gateway record every call's exact token ids,
and train on those ids: `collect_traces` does the first part, `trace_examples` the second, and
`reinforge sft` chains them (docs/training.md, "Warm starts from traces").
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from transformers import PreTrainedTokenizerBase

from reinforge.credit import CreditConfig
from reinforge.inference.contract import Backend
from reinforge.inference.run_sampling import RunSampling
from reinforge.runner import Agent, AgentFunction, CommandAgent, Runner
from reinforge.stack.app import ServedStack, StackApp
from reinforge.stack.settings import MODEL_NAME
from reinforge.store.protocol import Store
from reinforge.training.rollouts import (
    attempt_resources,
    collect_transitions,
    rollout_specs,
    run_rollouts,
)
from reinforge.training.runner_processes import RunnerProcesses, RunnerProcessSettings, agent_reference
from reinforge.training.sft import SftExample
from reinforge.types import (
    MAX_PAGE_SIZE,
    Rollout,
    RolloutMode,
    RolloutQuery,
    RolloutStatus,
    Transition,
)

TOKENIZER_RESOURCE = "tokenizer"
"""The resources key `collect_traces` writes the recording tokenizer's fingerprint under."""


class CollectReport(BaseModel):
    """What a collection recorded."""

    rollouts: int
    succeeded: int
    mean_reward: float
    seconds: float
    resources_version: int
    """The version the collection's rollouts name: `trace_examples` reads this recording alone by it."""


async def collect_traces(
    agent: Agent | AgentFunction | CommandAgent,
    tasks: Sequence[dict[str, Any]],
    backend: Backend,
    store: Store,
    *,
    concurrency: int = 64,
    max_tokens: int = 64,
    temperature: float = 1.0,
    timeout_s: float = 120.0,
    prefix: str | None = None,
    processes: int = 0,
    log_dir: Path | None = None,
    tokenizer_id: str | None = None,
) -> CollectReport:
    """Run `agent` once on each task with `backend` behind the gateway; every call lands in `store`.

    The agent is the one training will run (same code, same framework), so what is recorded is what
    its framework renders; only the policy answering it differs. `processes` > 0 runs the agents in
    that many `reinforge runner` children (each `concurrency` at once), beside the gateway's process.
    `tokenizer_id` (`tokenizer_fingerprint`) goes into the attempts' resources, so a later reader can
    tell whether the recorded token ids are its tokenizer's.
    """
    started = time.monotonic()
    stack = StackApp(store, backend)  # a token and a secret only this process knows
    served = ServedStack(stack)
    reference = agent_reference(agent) if processes > 0 else None  # refuse before serving
    await served.start()
    stop = asyncio.Event()
    children: RunnerProcesses | None = None
    running: asyncio.Task[object] | None = None
    if reference is not None:
        children = RunnerProcesses(
            RunnerProcessSettings.for_stack(
                served,
                reference,
                concurrency=concurrency,
                model=MODEL_NAME,
                timeout_s=timeout_s,
                log_dir=log_dir or Path(tempfile.mkdtemp(prefix="reinforge-collect-")),
            ),
            processes,
            id_prefix="trace-collector",
        )
        children.start()
    else:
        runner = Runner(
            store,
            agent,
            served.gateway_url,
            stack.gateway_secret,
            concurrency=concurrency,
            runner_id="trace-collector",
            timeout_s=timeout_s,
            poll_seconds=0.2,
            model=MODEL_NAME,
            drain_timeout_s=5.0,
            on_lease=stack.leased,
        )
        running = asyncio.create_task(runner.run(stop=stop))
    try:
        given = attempt_resources(0, RunSampling(temperature=temperature, max_tokens=max_tokens))
        if tokenizer_id is not None:
            given[TOKENIZER_RESOURCE] = tokenizer_id
        resources = await store.put_resources(given)
        specs = rollout_specs(
            list(enumerate(tasks)),
            prefix=prefix or f"traces-{secrets.token_hex(4)}",
            group_size=1,
            mode=RolloutMode.train,
            resources_version=resources.version,
        )
        wait_s = min(3600.0, max(timeout_s * 4, timeout_s * len(tasks) / max(concurrency, 1) * 2))
        rollouts = await run_rollouts(store, specs, wait_s)
    finally:
        stop.set()
        if children is not None:
            await asyncio.to_thread(children.stop)
        if running is not None:
            await asyncio.wait({running}, timeout=30)
            running.cancel()
        await served.stop()
    done = [r for r in rollouts if r.status == RolloutStatus.succeeded]
    return CollectReport(
        rollouts=len(rollouts),
        succeeded=len(done),
        mean_reward=sum(r.reward or 0.0 for r in done) / len(done) if done else 0.0,
        seconds=time.monotonic() - started,
        resources_version=resources.version,
    )


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A short hash of everything that decides a text's token ids: the pieces, merges, special tokens
    and chat template. Two tokenizers with the same fingerprint give the same ids."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    spelling = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    template = getattr(tokenizer, "chat_template", None)
    digest = hashlib.sha256(f"{spelling}\x1f{template}".encode())
    return digest.hexdigest()[:16]


async def recorded_tokenizers(store: Store, rollouts: Sequence[Rollout]) -> dict[int | None, str | None]:
    """For each resources version of `rollouts`, the `tokenizer_fingerprint` its calls were recorded
    with (None: the collection did not say)."""
    found: dict[int | None, str | None] = {}
    for version in {r.resources_version for r in rollouts}:
        given = None if version is None else (await store.get_resources(version)).resources
        found[version] = None if given is None else given.get(TOKENIZER_RESOURCE)
    return found


async def recorded_rollouts(store: Store) -> list[Rollout]:
    """Every succeeded rollout in `store`, oldest first."""
    found: list[Rollout] = []
    offset: int | None = 0
    while offset is not None:
        page = await store.query_rollouts(
            RolloutQuery(statuses=[RolloutStatus.succeeded], limit=MAX_PAGE_SIZE, offset=offset)
        )
        found += page.items
        offset = page.next_offset
    return found


def example_of(transition: Transition) -> SftExample:
    """The transition's exact tokens; only what the model generated (its response mask) carries loss."""
    return SftExample(
        input_ids=transition.prompt_ids + transition.response_ids,
        loss_mask=[0] * len(transition.prompt_ids) + transition.response_mask,
    )


async def trace_examples(
    store: Store,
    *,
    min_reward: float | None = None,
    agents: Sequence[str] | None = None,
    tokenizer_id: str | None = None,
    resources_version: int | None = None,
) -> list[SftExample]:
    """Supervised examples from the conversations recorded in `store`.

    A rollout's calls are merged into one sequence where each call's prompt extends the previous
    call's tokens (tool results are context, not targets), as RL's merged credit mode does. Only
    rollouts whose reward reaches `min_reward` are kept, only the calls of `agents` (all: None), with
    `tokenizer_id`, none recorded with another tokenizer (those whose collection did not say stay),
    and with `resources_version`, only one collection's (`CollectReport.resources_version`).
    """
    credit = CreditConfig(mode="merged", agents=list(agents) if agents else None)
    rollouts = await recorded_rollouts(store)
    if resources_version is not None:
        rollouts = [r for r in rollouts if r.resources_version == resources_version]
    if tokenizer_id is not None:
        recorded_with = await recorded_tokenizers(store, rollouts)
        rollouts = [r for r in rollouts if recorded_with[r.resources_version] in (None, tokenizer_id)]
    if min_reward is not None:
        rollouts = [r for r in rollouts if (r.reward or 0.0) >= min_reward]
    transitions, _ = await collect_transitions(store, rollouts, credit)
    return [example_of(t) for t in transitions if any(t.response_mask)]
