"""`Trainer.fit` with a command agent: a plain script, run once per attempt, that reaches the policy
through the gateway with only the environment it is given, and reports its reward on stdout."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.runner import CommandAgent
from reinforge.store.sql.store import SqlStore
from reinforge.training import Trainer, TrainerConfig
from reinforge.training.audit import audit_run
from reinforge.types import RolloutQuery, RolloutStatus

from .conftest import small_model

AGENT = r"""
import json, os, urllib.request

task = json.loads(os.environ["REINFORGE_TASK"])
sampling = json.loads(os.environ["REINFORGE_RESOURCES"]).get("sampling", {})
body = {
    "model": os.environ["OPENAI_MODEL"],
    "messages": [{"role": "user", "content": task["question"]}],
    "temperature": sampling.get("temperature", 1.0),
    "max_tokens": 6,
}
request = urllib.request.Request(
    os.environ["OPENAI_BASE_URL"].rstrip("/") + "/chat/completions",
    data=json.dumps(body).encode(),
    headers={"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"], "Content-Type": "application/json"},
)
reply = json.load(urllib.request.urlopen(request, timeout=60))["choices"][0]["message"]["content"] or ""
print("REINFORGE_REWARD=" + ("1" if len(reply) % 2 == 0 else "0"))
"""

TRAIN = [{"task_id": f"t{i}", "question": f"{i}+{i}*2"} for i in range(8)]


def _config(run_dir: Path, **changes: Any) -> TrainerConfig:
    settings: dict[str, Any] = {
        "run_dir": run_dir,
        "progress": False,
        "optim": {"learning_rate": 1e-2},
        "rollouts": {"tasks_per_step": 2, "max_tokens": 6},
        "runners": {"concurrency": 8},
        "engine": {"max_batch_size": 8, "max_seq_len": 128},
        "schedule": {"max_steps": 2, "val_every": 0},
        "checkpoints": {"every": 0},
    }
    return TrainerConfig(**{**settings, **changes})


def test_fit_trains_a_command_agent(tokenizer: Any, tmp_path: Path) -> None:
    script = tmp_path / "agent.py"
    script.write_text(AGENT)
    model = small_model(tokenizer, seed=3)
    start = torch.cat([p.detach().flatten() for p in model.parameters()]).clone()
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=4),
        credit=CreditConfig(mode="per_call"),
        config=_config(tmp_path / "run"),
    )
    result = trainer.fit(CommandAgent([sys.executable, str(script)], timeout_s=60), TRAIN)

    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2] and result.policy_version == 2
    for r in steps:
        # Every attempt's one LLM call was recorded by the gateway and trained on.
        assert r["train/rollouts"] == 8 and r["credit/transitions"] == 8 and r["tokens"] > 0
    moved = not torch.equal(torch.cat([p.detach().flatten() for p in model.parameters()]), start)
    assert moved == any(r["groups_flat"] < r["groups"] for r in steps)

    async def check_store() -> None:
        store = await SqlStore.open(f"sqlite:///{tmp_path / 'run' / 'store.db'}")
        try:
            rollouts = (await store.query_rollouts(RolloutQuery(limit=100))).items
            audit = await audit_run(tmp_path / "run", store)
        finally:
            await store.close()
        assert len(rollouts) == 16 and all(r.status == RolloutStatus.succeeded for r in rollouts)
        # The rewards are the script's stdout lines: 0 or 1, as the parity of its reply says.
        assert {r.reward for r in rollouts} <= {0.0, 1.0}
        assert audit.ok and audit.transitions == 16 and audit.steps == 2

    asyncio.run(check_store())
    lines = [json.loads(x) for x in (tmp_path / "run" / "transitions.jsonl").read_text().splitlines()]
    assert sorted({x["step"] for x in lines}) == [1, 2] and len(lines) == 16


def test_a_command_agent_refuses_runner_processes(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=2),
        config=_config(tmp_path / "run", runners={"processes": 1}),
    )
    with pytest.raises(InvalidRequestError, match="command agent already runs in its own process"):
        trainer.fit(CommandAgent([sys.executable, "-c", "print('REINFORGE_REWARD=1')"]), TRAIN)
