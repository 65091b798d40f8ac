"""The paper's three experiments in miniature: each example's own config, agent, scripted policy and
base model, through the whole pipeline a user runs (`reinforge sft`, then `reinforge train`), for two
RL steps. What runs is real: the framework package, the gateway on 127.0.0.1, SQLite stores."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from reinforge import semconv
from reinforge.store.factory import open_store
from reinforge.training.collect import recorded_rollouts
from reinforge.training.rollouts import collect_transitions
from reinforge.training.run_config import (
    RunConfig,
    load_dataset,
    load_run_config,
    resolve_agent,
)
from reinforge.training.trainer import Trainer
from reinforge.training.warm_start import build_warm_start
from reinforge.types import SpanQuery

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def miniature(name: str, tmp_path: Path, config_file: str = "config.toml") -> RunConfig:
    """The example's config with a tmp run folder, a few tasks, two steps and in-process runners."""
    cfg = load_run_config(
        EXAMPLES / name / config_file,
        {
            "run_dir": tmp_path / "run",
            "progress": False,
            "schedule": {"max_steps": 2, "max_minutes": None, "val_greedy": False},
            "rollouts": {"tasks_per_step": 2},
            "runners": {"processes": 0, "concurrency": 32},
            "checkpoints": {"every": 0},
        },
    )
    assert cfg.warm_start is not None
    cfg.warm_start.store = str(tmp_path / "traces.db")
    cfg.warm_start.out = str(tmp_path / "warm-start")
    cfg.warm_start.tasks = 12
    cfg.warm_start.processes = 0
    cfg.warm_start.sft.steps = 2
    cfg.warm_start.sft.batch_size = 8
    cfg.model.path = str(tmp_path / "warm-start")
    return cfg


def run_miniature(cfg: RunConfig, val_size: int = 4) -> tuple[Any, Any]:
    torch.manual_seed(0)
    report = asyncio.run(build_warm_start(cfg, log=lambda _line: None))
    train = load_dataset(cfg.data.train, cfg.base_dir)[:32]
    assert cfg.data.val is not None
    val = load_dataset(cfg.data.val, cfg.base_dir)[:val_size]
    trainer = Trainer(cfg.model.path, algorithm=cfg.algorithm_config(), credit=cfg.credit, config=cfg.trainer)
    fit = trainer.fit(resolve_agent(cfg), train, val)
    return report, fit


@pytest.fixture(autouse=True)
def _own_caches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REINFORGE_SQL_CACHE", str(tmp_path / "sql-cache"))
    monkeypatch.setenv("REINFORGE_RAG_CACHE", str(tmp_path / "rag-cache"))
    monkeypatch.setattr(sys, "path", list(sys.path))


def test_calc_x_autogen_warm_start_and_two_rl_steps(tmp_path: Path) -> None:
    cfg = miniature("calc_x", tmp_path)
    report, fit = run_miniature(cfg)
    assert report.collected is not None and report.collected.succeeded == 12
    # The scripted mix: some conversations solve the problem, some guess or answer too early.
    assert 0.0 < report.collected.mean_reward < 1.0
    assert report.examples == 12  # each AutoGen conversation merges into one sequence
    assert fit.steps == 2
    assert set(fit.val_after) >= {"val/success", "val/reward"}
    assert sum(r.get("credit/calls_trained", 0.0) for r in fit.history) > 0


def test_sql_langgraph_trains_writer_and_rewriter_not_checker(tmp_path: Path) -> None:
    cfg = miniature("sql", tmp_path)
    assert cfg.credit.agents == ["writer", "rewriter"]
    report, fit = run_miniature(cfg)
    assert report.collected is not None and report.collected.succeeded == 12
    # Every graph run has at least a writer and a checker call; rejected queries add rewrites.
    assert report.examples >= 24
    assert fit.steps == 2
    trained = sum(r.get("credit/calls_trained", 0.0) for r in fit.history)
    filtered = sum(r.get("credit/calls_filtered", 0.0) for r in fit.history)
    assert trained > 0 and filtered > 0  # the checker's calls are recorded but not trained
    names, transitions = asyncio.run(recorded_roles(cfg))
    assert names == {"writer", "checker", "rewriter"} or names == {"writer", "checker"}
    assert transitions and {t.agent_name for t in transitions} <= {"writer", "rewriter"}
    assert all(any(t.response_mask) for t in transitions)


async def recorded_roles(cfg: RunConfig) -> tuple[set[str], list[Any]]:
    """The agent names of every recorded call of the run, and the transitions its credit config
    trains on (what the policy update sees)."""
    store = await open_store(cfg.trainer.store_location)
    try:
        rollouts = await recorded_rollouts(store)
        spans = (await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1000))).items
        transitions, _ = await collect_transitions(store, rollouts, cfg.credit)
    finally:
        await store.close()
    return {str(s.attributes.get(semconv.ATTR_AGENT_NAME)) for s in spans}, transitions


def test_rag_agents_sdk_reward_is_graded(tmp_path: Path) -> None:
    cfg = miniature("rag", tmp_path)
    assert cfg.report is not None and cfg.report.metric == "reward"
    report, fit = run_miniature(cfg)
    assert report.collected is not None and report.collected.succeeded == 12
    assert 0.0 < report.collected.mean_reward < 1.0
    assert fit.steps == 2
    assert 0.0 <= fit.val_after["val/reward"] <= 1.0


@pytest.mark.parametrize("name", ["rag", "sql"])
def test_a_second_warm_start_phase_continues_from_the_first_and_rl_starts_from_it(name: str) -> None:
    first = load_run_config(EXAMPLES / name / "config.toml")
    second = load_run_config(EXAMPLES / name / "config_continue.toml")
    assert first.warm_start is not None and second.warm_start is not None
    here = EXAMPLES / name
    first_out = first.warm_start.out_dir(here).resolve()
    second_out = second.warm_start.out_dir(here).resolve()
    assert (here / second.warm_start.base).resolve() == first_out != second_out
    assert (here / second.model.path).resolve() == second_out
    assert second.warm_start.store == first.warm_start.store  # the same recorded traces
    if name == "sql":  # per-role adapters train from the same (second-phase) warm start
        lora = load_run_config(EXAMPLES / name / "config_lora.toml")
        assert lora.model.path == second.model.path
        assert lora.warm_start == second.warm_start
