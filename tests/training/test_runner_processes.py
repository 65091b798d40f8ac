"""Trainer.fit with `runners.processes`: agents in `reinforge runner` children, found by name."""

from __future__ import annotations

import asyncio
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from reinforge.algorithms import GRPO
from reinforge.errors import InvalidRequestError
from reinforge.runner import CommandAgent, agent, load_agent
from reinforge.store.factory import open_store
from reinforge.training import Trainer
from reinforge.training.runner_processes import agent_reference
from reinforge.types import AttemptQuery, SpanQuery

from . import process_agents
from .conftest import parity_agent, small_model
from .test_trainer import TRAIN, config


def test_agent_reference_names_module_level_agents() -> None:
    assert agent_reference(parity_agent) == f"{parity_agent.__module__}:parity_agent"
    assert agent_reference(process_agents.ClassAgent) == f"{process_agents.__name__}:ClassAgent"
    assert agent_reference(process_agents.SHARED_INSTANCE) == f"{process_agents.__name__}:SHARED_INSTANCE"
    # What the reference names is the same agent again.
    assert load_agent(agent_reference(process_agents.SHARED_INSTANCE)) is process_agents.SHARED_INSTANCE


def test_agents_a_child_could_not_import_are_refused() -> None:
    @agent(name="nested")
    def nested(task: dict[str, Any], llm: Any) -> float:
        return 0.0

    with pytest.raises(InvalidRequestError, match="module level"):
        agent_reference(nested)
    with pytest.raises(InvalidRequestError, match="module level"):
        agent_reference(lambda task, llm: 0.0)
    with pytest.raises(InvalidRequestError, match="not a module-level name"):
        agent_reference(process_agents.ClassAgent())
    with pytest.raises(InvalidRequestError, match="command agent"):
        agent_reference(CommandAgent("true"))


def test_load_agent_imports_a_script_without_running_its_main(tmp_path: Path) -> None:
    script = tmp_path / "train_me.py"
    script.write_text(
        "import reinforge\n"
        "@reinforge.agent(name='scripted')\n"
        "def solve(task, llm):\n"
        "    return 1.0\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('the main block ran')\n",
        encoding="utf-8",
    )
    loaded = load_agent(f"{script}:solve")
    assert loaded.name == "scripted" and loaded.rollout({}, None) == 1.0  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="no such file"):
        load_agent(f"{tmp_path / 'missing.py'}:solve")


async def _runner_ids_and_llm_spans(run_dir: Path) -> tuple[set[str], int, int]:
    store = await open_store(f"sqlite:///{run_dir / 'store.db'}")
    try:
        attempts = await store.query_attempts(AttemptQuery(limit=1000))
        spans = await store.query_spans(SpanQuery(name="reinforge.llm_call", limit=1000))
        with_ids = sum(
            1
            for s in spans.items
            if s.attributes.get("reinforge.llm.prompt_token_ids")
            and s.attributes.get("reinforge.llm.completion_token_ids")
        )
        return {a.runner_id for a in attempts.items}, spans.total, with_ids
    finally:
        await store.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_fit_runs_agents_in_runner_processes(tokenizer: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from reinforge.training import rollout_stack

    started: list[Any] = []
    real_start = rollout_stack.RolloutStack.start

    niceness: list[int] = []

    async def remember(self: Any, *args: Any, **kwargs: Any) -> Any:
        started.append(self)
        stack = await real_start(self, *args, **kwargs)
        niceness.extend(os.getpriority(os.PRIO_PROCESS, pid) for pid in stack.runner_pids)
        return stack

    monkeypatch.setattr(rollout_stack.RolloutStack, "start", remember)
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=4),
        config=config(tmp_path, runners={"processes": 2, "concurrency": 4}, checkpoints={"every": 0}),
    )
    result = trainer.fit(parity_agent, TRAIN)

    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and result.policy_version == 2
    assert all(r["train/rollouts"] == 8 and r["credit/transitions"] == 8 for r in steps)
    runner_ids, llm_spans, with_ids = asyncio.run(_runner_ids_and_llm_spans(tmp_path))
    # Every attempt ran in a child (none in the trainer's process), each call recorded with its ids.
    assert runner_ids and runner_ids <= {"trainer-process-0", "trainer-process-1"}
    assert llm_spans == with_ids == 16
    # None is left running, and the children that ran attempts stopped gracefully, each printing its
    # summary (a child still importing when two tiny steps are over ends without one).
    pids = started[0].runner_pids
    assert len(pids) == 2 and not any(_alive(pid) for pid in pids)
    # The children ran at a lower CPU priority than the trainer (runners.processes_nice, default 10).
    assert niceness == [min(os.getpriority(os.PRIO_PROCESS, 0) + 10, 19)] * 2
    logs = [(tmp_path / "logs" / f"runner-{i}.log").read_text() for i in range(2)]
    leased = [int(m) for log in logs for m in re.findall(r"runner done: leased (\d+)", log)]
    assert sum(leased) == 16


def test_a_runner_process_in_a_crash_loop_stops_the_run_at_once(tokenizer: Any, tmp_path: Path) -> None:
    """One death is restarted (tests/chaos); a child that dies again and again stops the run."""
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=2),
        config=config(
            tmp_path,
            runners={"processes": 1, "concurrency": 2, "crash_loop_deaths": 2},
            rollouts={"step_timeout_s": 300.0},
        ),
    )
    began = time.monotonic()
    with pytest.raises(
        RuntimeError, match=r"runner process 0 \(pid \d+\) died 2 times within 60 s \(last exit code 3\)"
    ):
        trainer.fit(process_agents.exiting_agent, TRAIN)
    assert time.monotonic() - began < 120  # not the step timeout


def test_fit_refuses_an_agent_it_cannot_start_elsewhere(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=2),
        config=config(tmp_path, runners={"processes": 1}),
    )
    with pytest.raises(InvalidRequestError, match="module level"):
        trainer.fit(lambda task, llm: 1.0, TRAIN)
