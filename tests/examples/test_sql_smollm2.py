"""The Text-to-SQL configs on the real SmolLM2-135M-Instruct: the LangGraph graph's writer, checker and
rewriter calls through the gateway on the model's own ChatML template, and with per-role adapters a
training step that leaves the checker frozen (it has no adapter, and the shared base does not move)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from reinforge.training.run_config import load_dataset, load_run_config, resolve_agent
from reinforge.training.trainer import Trainer

from .smollm2_rollouts import SMOLLM2, run_on_smollm2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sql"


@pytest.fixture(autouse=True)
def _own_path(monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("REINFORGE_SQL_CACHE", str(tmp_path / "sql-cache"))
    monkeypatch.setattr(sys, "path", [str(EXAMPLE), *sys.path])
    monkeypatch.setenv("REINFORGE_MODELS_DIR", str(smollm2_cache))


async def test_the_graph_runs_on_the_real_model_with_its_template(smollm2_cache: Path) -> None:
    from sql_data import val_tasks

    cfg = load_run_config(EXAMPLE / "config_smollm2.toml")
    assert cfg.model.path == SMOLLM2 and cfg.credit.agents == ["writer", "rewriter"]
    recorded = await run_on_smollm2(
        smollm2_cache, resolve_agent(cfg), val_tasks(1), cfg.credit, max_tokens=16
    )
    rec = recorded[0]
    assert rec.rollout.reward in (0.0, 1.0)
    assert rec.agent_names[:2] == ["writer", "checker"]
    assert set(rec.agent_names) <= {"writer", "checker", "rewriter"}
    # Per call: the checker's calls are recorded but not trained; nothing to merge, nothing unmatched.
    assert rec.transitions == sum(name != "checker" for name in rec.agent_names)
    assert rec.merge_mismatches == 0
    for prompt in rec.prompts:
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "Reply with the query only." in rec.prompts[0] and "Reply OK if" in rec.prompts[1]


def test_a_training_step_leaves_the_checker_frozen(smollm2_cache: Path, tmp_path: Path) -> None:
    cfg = load_run_config(
        EXAMPLE / "config_smollm2_lora.toml",
        {
            "run_dir": tmp_path / "run",
            "progress": False,
            "schedule": {"max_steps": 1, "max_minutes": None, "val_greedy": False},
            "rollouts": {"tasks_per_step": 1, "max_tokens": 12},
            "runners": {"processes": 0, "concurrency": 8},
            "checkpoints": {"every": 0},
        },
    )
    assert cfg.trainer.optim.lora is not None and cfg.trainer.optim.lora.roles == ["writer", "rewriter"]
    algorithm = cfg.algorithm_config().model_copy(update={"group_size": 2})
    trainer = Trainer(SMOLLM2, algorithm=algorithm, credit=cfg.credit, config=cfg.trainer)

    fit = trainer.fit(resolve_agent(cfg), load_dataset(cfg.data.train, cfg.base_dir)[:4], [])
    assert fit.steps == 1
    params = dict(trainer.model.named_parameters())
    adapters = {n for n in params if "lora_" in n}
    assert {r for r in ("writer", "rewriter", "checker") if any(f".{r}." in n for n in adapters)} == {
        "writer",
        "rewriter",
    }
    # The checker runs on the base: every base weight is still the packaged model's.
    original = AutoModelForCausalLM.from_pretrained(smollm2_cache / SMOLLM2, dtype=torch.float32).state_dict()
    compared = 0
    for name, param in params.items():
        if "lora_" in name:
            continue
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(param.detach().float(), original[key].float()), name
        compared += 1
    assert compared == len(original) or compared >= 200
