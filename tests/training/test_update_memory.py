"""The embedded engine's KV cache is freed before each update (`RolloutStack.release_engine_cache`):
on a CPU the update and the engine share one memory, and the cache is stale once the update publishes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.engine.model_runner import SlotCacheRunner
from reinforge.training import Trainer, TrainerConfig
from reinforge.training.policy import Policy

from .conftest import parity_agent, small_model

TRAIN = [{"task_id": f"t{i}", "question": f"{i}+{i}*2"} for i in range(12)]


def test_every_update_runs_with_the_engines_cache_freed(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    freed: list[int] = []  # the cache's slots each time one was freed
    seen_by_updates: list[list[int]] = []
    release, update = SlotCacheRunner.release_cache, Policy.update

    def recording_release(self: SlotCacheRunner) -> None:
        freed.append(self.slot_capacity())
        release(self)

    def checking_update(self: Policy, *args: Any, **kwargs: Any) -> Any:
        deadline = time.monotonic() + 5.0  # the engine's thread frees it as soon as it wakes
        while len(freed) <= len(seen_by_updates) and time.monotonic() < deadline:
            time.sleep(0.005)
        seen_by_updates.append(list(freed))
        return update(self, *args, **kwargs)

    monkeypatch.setattr(SlotCacheRunner, "release_cache", recording_release)
    monkeypatch.setattr(Policy, "update", checking_update)
    config = TrainerConfig(
        run_dir=tmp_path,
        progress=False,
        optim={"learning_rate": 1e-2},
        rollouts={"tasks_per_step": 2, "max_tokens": 6},
        runners={"concurrency": 8},
        engine={"max_batch_size": 8, "max_seq_len": 128},
        schedule={"max_steps": 2, "val_every": 0},
        checkpoints={"every": 0},
    )
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=4),
        credit=CreditConfig(mode="per_call"),
        config=config,
    )
    result = trainer.fit(parity_agent, TRAIN, [])

    assert result.steps == 2
    # Each update began after a release of a cache that held the step's sequences.
    assert [len(seen) for seen in seen_by_updates] == [1, 2]
    assert all(slots > 0 for slots in freed[:2])
