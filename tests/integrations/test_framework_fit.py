"""A short `Trainer.fit` of each framework's calc example (examples/frameworks/) on the tiny model.

Real framework packages, the real gateway and engine, the shipped warm start: each fit must run its
steps, record every LLM call with token ids (transitions built, nothing skipped), log rewards, and
merge the conversation's calls (the history each framework sends back extends the tokens generated).
"""

from __future__ import annotations

import importlib
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from reinforge import CommandAgent
from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.tasks import train_tasks, val_tasks
from reinforge.demo.warm_start import load_warm_start
from reinforge.training import (
    CheckpointSettings,
    EngineSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    Trainer,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "frameworks"

CASES = [
    ("langgraph", "langgraph_calc", "calc_agent"),
    ("agents", "openai_agents_calc", "chat_agent"),
    ("agents", "openai_agents_calc", "responses_agent"),
    ("autogen_agentchat", "autogen_calc", "calc_agent"),
    ("anthropic", "anthropic_calc", "calc_agent"),
    ("langgraph", "langgraph_two_roles", "calc_agent"),  # trains the solver role alone
    ("opentelemetry.exporter.otlp.proto.http", "otlp_agent", "command"),  # a subprocess exporting OTLP
]
TRAINED_ROLES = {"langgraph_two_roles": ["solver"]}


def example_agent(package: str, module: str, attribute: str) -> Any:
    pytest.importorskip(package)
    if attribute == "command":
        return CommandAgent([sys.executable, str(EXAMPLES / f"{module}.py")], timeout_s=60)
    sys.path.insert(0, str(EXAMPLES))
    try:
        return getattr(importlib.import_module(module), attribute)
    finally:
        sys.path.remove(str(EXAMPLES))


def _decoded(message: str, tokenizer: Any) -> str:
    """A merge-mismatch log line with its two token-id windows decoded."""
    windows = re.findall(r"(history|prompt) (\[[\d, ]*\])", message)
    texts = [f"{name}={tokenizer.decode(json.loads(ids))!r}" for name, ids in windows]
    return message + " :: " + " ".join(texts)


@pytest.mark.parametrize(("package", "module", "attribute"), CASES, ids=[f"{m}:{a}" for _, m, a in CASES])
def test_a_short_fit_of_each_framework_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, package: str, module: str, attribute: str
) -> None:
    caplog.set_level(logging.DEBUG, logger="reinforge.credit.merge")  # says where a mismatch diverged
    agent = example_agent(package, module, attribute)
    model, tokenizer = load_warm_start()
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=4, loss_agg="seq-mean-token-mean", seq_unit="rollout"),
        credit=CreditConfig(mode="merged", assignment="equal+air", agents=TRAINED_ROLES.get(module)),
        run_dir=tmp_path / "run",
        rollouts=RolloutSettings(tasks_per_step=4, max_tokens=48),
        runners=RunnerSettings(concurrency=16, processes=0),
        engine=EngineSettings(max_batch_size=16),
        schedule=ScheduleSettings(max_steps=2),
        checkpoints=CheckpointSettings(every=0),
        progress=False,
    )
    fit = trainer.fit(agent, train_tasks(32), val_tasks(8))
    steps = [r for r in fit.history if "train/reward" in r]
    assert fit.steps == 2 and len(steps) == 2
    for record in steps:
        assert 0.0 <= record["train/reward"] <= 1.0
        assert record["credit/calls"] >= 16  # every rollout made at least one recorded call
        assert record["credit/calls_skipped"] == 0  # each with token ids and logprobs
        assert record["credit/transitions"] > 0
    respelled = sum(r["credit/history_respelled"] for r in steps)
    assert sum(r["credit/history_unmatched"] for r in steps) == 0  # every turn sent back was found
    if module.startswith("langgraph"):  # LangChain re-dumps arguments with spaces; put back as written
        assert respelled > 0
    merged = sum(r["credit/merged_calls"] for r in steps)
    mismatched = sum(r["credit/merge_mismatches"] for r in steps)
    # Nearly every call extends the last one. A CI run once saw 1 mismatch in 36 calls of
    # langgraph_two_roles that six reruns (and ~1,000 more merged calls) did not repeat. The likely
    # cause, a sampled tool call spelt otherwise than the chat template spells it, is now kept as its
    # token ids (inference/chat_render.py); until that is confirmed, one in ten is tolerated rather
    # than none, and any mismatch is described in the failure message, decoded.
    logged = [r.getMessage() for r in caplog.records]
    mismatches = [_decoded(m, tokenizer) for m in logged if m.startswith("merge mismatch")]
    assert merged > 0 and mismatched <= merged // 10, (merged, mismatched, mismatches)
    if module in TRAINED_ROLES:  # the checker's calls were recorded under its node's name, and left out
        assert all(r["credit/calls_filtered"] >= 4 for r in steps)
        assert all(r["credit/calls_named_by_role"] == r["credit/calls"] for r in steps)
    assert "val/success" in fit.val_before and "val/success" in fit.val_after
