"""Asynchronous training with bounded staleness, end to end on CPU (`schedule.max_staleness`)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.runner import LLM, agent
from reinforge.store.factory import open_store
from reinforge.training import Trainer, TrainerConfig
from reinforge.training.async_rollouts import AsyncRolloutState
from reinforge.training.checkpoint import latest_checkpoint, load_checkpoint
from reinforge.training.data import TaskSampler
from reinforge.types import RolloutQuery, RolloutStatus

from .conftest import small_model

SLOW_DRAW = 1
"""The run's second task (drawn with step 1's groups) has the slow tool."""
_FIRST_DRAWS = TaskSampler(24, seed=TrainerConfig().seed).next_batch(12)


def _tasks(run_dir: Path, slow_until_step: int = 2) -> list[dict[str, Any]]:
    """24 calc-style questions; the slow one's tool answers once the run logged `slow_until_step`,
    so its first call (sampled by version 0) is that many versions stale when its group completes."""
    slow = _FIRST_DRAWS[SLOW_DRAW]
    return [
        {
            "task_id": f"t{i}",
            "question": f"{i}+{i}*2",
            "slow_until_step": slow_until_step if i == slow else 0,
            "metrics": str(run_dir / "metrics.jsonl"),
        }
        for i in range(24)
    ]


async def _tool(task: dict[str, Any]) -> None:
    """Most calls 10 ms; the slow one waits for the trainer (at most 30 s)."""
    await asyncio.sleep(0.01)
    until, metrics = int(task["slow_until_step"]), Path(task["metrics"])
    for _ in range(600):
        if until == 0 or _logged_step(metrics) >= until:
            return
        await asyncio.sleep(0.05)


def _logged_step(metrics: Path) -> int:
    if not metrics.is_file():
        return 0
    steps = [
        json.loads(line).get("step", 0) for line in metrics.read_text(encoding="utf-8").splitlines() if line
    ]
    return max(steps, default=0)


@agent(name="slow_tool")
async def slow_tool_agent(task: dict[str, Any], llm: LLM) -> float:
    """A calc-style agent: a call, a tool, a second call. Reward: the parity of the replies' length."""
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    try:
        messages: list[Any] = [{"role": "user", "content": str(task["question"])}]
        first = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=4)
        await _tool(task)
        text = first.choices[0].message.content or ""
        messages += [{"role": "assistant", "content": text}, {"role": "user", "content": "4"}]
        second = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=4)
        return float((len(text) + len(second.choices[0].message.content or "")) % 2 == 0)
    finally:
        await client.close()


def _config(run_dir: Path, max_steps: int, k: int) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "run_dir": run_dir,
            "progress": False,
            "optim": {"learning_rate": 1e-2},
            "rollouts": {"tasks_per_step": 2, "max_tokens": 4},
            "runners": {"concurrency": 32},
            "engine": {"max_batch_size": 32, "max_seq_len": 128},
            "schedule": {"max_steps": max_steps, "val_every": 0, "max_staleness": k},
            "checkpoints": {"every": 1},
        }
    )


def _trainer(tokenizer: Any, run_dir: Path, max_steps: int, k: int) -> Trainer:
    return Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=4),
        credit=CreditConfig(mode="per_call"),
        config=_config(run_dir, max_steps, k),
    )


def _trained_staleness(run_dir: Path) -> list[int]:
    """Per trained transition: the version its step updated minus the version that sampled it."""
    lines = (run_dir / "transitions.jsonl").read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [(r["step"] - 1) - r["policy_version"] for r in records]


async def _statuses(run_dir: Path) -> dict[str, int]:
    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        rollouts = (await store.query_rollouts(RolloutQuery(limit=1000))).items
    finally:
        await store.close()
    counts: dict[str, int] = {}
    for r in rollouts:
        counts[r.status.value] = counts.get(r.status.value, 0) + 1
    return counts


def test_staleness_never_exceeds_k_yet_rollouts_run_ahead(tokenizer: Any, tmp_path: Path) -> None:
    result = _trainer(tokenizer, tmp_path, max_steps=5, k=1).fit(slow_tool_agent, _tasks(tmp_path))
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4, 5] and result.policy_version == 5
    staleness = _trained_staleness(tmp_path)
    assert staleness and max(staleness) <= 1 and min(staleness) >= 0
    assert any(s > 0 for s in staleness), "rollouts drawn for later steps were trained one version behind"
    assert all(r["staleness/max"] <= 1 for r in steps)
    assert sum(r["staleness/trained"] for r in steps) == len(staleness)
    last = steps[-1]
    assert last["staleness/trained_total"] == len(staleness)
    assert last["staleness/dropped_total"] == sum(r["staleness/dropped"] for r in steps)
    # The slow group ended two versions after its first call: that call was dropped, not trained.
    assert last["staleness/dropped_total"] > 0
    assert all(r["async/groups_trained"] == 2 and r["train/rollouts"] == 8 for r in steps)
    # Nothing is left running: the groups still in flight at the end were cancelled.
    counts = asyncio.run(_statuses(tmp_path))
    assert set(counts) <= {RolloutStatus.succeeded.value, RolloutStatus.cancelled.value}
    assert counts[RolloutStatus.succeeded.value] >= 5 * 8


def test_resume_keeps_staleness_accounting_and_the_rollouts_in_flight(tokenizer: Any, tmp_path: Path) -> None:
    first = _trainer(tokenizer, tmp_path, max_steps=2, k=2).fit(slow_tool_agent, _tasks(tmp_path, 3))
    meta, _, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    state = AsyncRolloutState.model_validate(meta.extra["async_rollouts"])
    assert meta.step == 2 and state.max_staleness == 2
    # k = 2: three steps' worth of groups (6) in flight, 2 trained a step, 2 drawn at step 2.
    assert len(state.in_flight) == 4
    # The slow group (its tool waits for step 3) is among them: it could not have ended.
    assert _FIRST_DRAWS[SLOW_DRAW] in {g.task_index for g in state.in_flight}
    assert state.counters.groups_enqueued == 8 and meta.sampler == {"epoch": 0, "position": 8}
    steps = [r for r in first.history if "train/reward" in r]
    assert state.counters.trained == sum(r["staleness/trained"] for r in steps) > 0
    assert state.counters.dropped == sum(r["staleness/dropped"] for r in steps)

    resumed = _trainer(tokenizer, tmp_path, max_steps=4, k=2).fit(slow_tool_agent, _tasks(tmp_path, 3))
    assert resumed.resumed_from == 2 and resumed.policy_version == 4
    steps = [r for r in resumed.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    third = steps[2]
    # Every group in flight at the checkpoint came back: collected when it had ended, else re-enqueued.
    assert third["async/resumed_collected"] + third["async/resumed_requeued"] == 4
    assert third["async/resumed_requeued"] >= 1  # the slow group, cancelled when the first fit ended
    # The counters carry on from the checkpoint instead of restarting.
    assert steps[-1]["staleness/trained_total"] == sum(r["staleness/trained"] for r in steps)
    assert steps[-1]["staleness/dropped_total"] == sum(r["staleness/dropped"] for r in steps)
    staleness = _trained_staleness(tmp_path)
    assert len(staleness) == steps[-1]["staleness/trained_total"] and max(staleness) <= 2
    # Two new groups drawn a step (sampler at 8 + 4), and the re-enqueued ones under new ids.
    meta, _, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    counters = AsyncRolloutState.model_validate(meta.extra["async_rollouts"]).counters
    assert meta.step == 4 and meta.sampler == {"epoch": 0, "position": 12}
    assert counters.groups_enqueued == 12 + third["async/resumed_requeued"]


def test_max_staleness_refuses_the_other_schedules(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="max_staleness"):
        Trainer(
            small_model(tokenizer),
            tokenizer,
            run_dir=tmp_path,
            schedule={"max_staleness": 1, "overlap_rollouts": True},
        )
