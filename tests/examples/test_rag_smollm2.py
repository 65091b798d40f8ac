"""The retrieval config on the real SmolLM2-135M-Instruct: the Agents SDK researcher's rollouts through
the gateway on the model's own ChatML template, the demonstration in the prompt, one merged sample."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from reinforge.training.run_config import load_run_config, resolve_agent

from .smollm2_rollouts import SMOLLM2, run_on_smollm2

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "rag" / "config_smollm2.toml"


@pytest.fixture(autouse=True)
def _own_path(monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("REINFORGE_RAG_CACHE", str(tmp_path / "rag-cache"))
    monkeypatch.setattr(sys, "path", [str(CONFIG.parent), *sys.path])
    monkeypatch.setenv("REINFORGE_MODELS_DIR", str(smollm2_cache))


async def test_the_agent_runs_on_the_real_model_with_its_template(smollm2_cache: Path) -> None:
    cfg = load_run_config(CONFIG)
    from rag_data import val_tasks
    from rag_smollm2 import DEMO_QUESTION

    assert cfg.model.path == SMOLLM2 and cfg.warm_start is None
    recorded = await run_on_smollm2(
        smollm2_cache, resolve_agent(cfg), val_tasks(2), cfg.credit, max_tokens=24
    )
    for rec in recorded:
        assert 0.0 <= rec.rollout.reward <= 1.0 and rec.calls >= 1
        assert rec.transitions == 1 and rec.merge_mismatches == 0  # merge rate 1.0
        prompt = rec.prompts[0]
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
        assert DEMO_QUESTION in prompt and prompt.count("<tool_call>") >= 2  # the demonstration
        assert str(rec.rollout.task["question"]) in prompt
    assert {name for rec in recorded for name in rec.agent_names} == {"researcher"}
