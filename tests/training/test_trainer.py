"""Trainer.fit end to end on CPU: real SQLite store, store server + gateway, engine, runners."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.training import OptimSettings, ScheduleSettings, Trainer, TrainerConfig
from reinforge.training.checkpoint import latest_checkpoint, load_checkpoint

from .conftest import parity_agent, small_model

TRAIN = [{"task_id": f"t{i}", "question": f"{i}+{i}*2"} for i in range(20)]
VAL = [{"task_id": f"v{i}", "question": f"{i}*3-1"} for i in range(4)]


BASE: dict[str, Any] = {
    "progress": False,
    "optim": {"learning_rate": 1e-2},
    "rollouts": {"tasks_per_step": 2, "max_tokens": 6},
    "runners": {"concurrency": 16},
    "engine": {"max_batch_size": 16, "max_seq_len": 128},
    "schedule": {"max_steps": 2, "val_every": 0},
    "checkpoints": {"every": 1},
}


def config(run_dir: Path, **groups: Any) -> TrainerConfig:
    """The tests' small run; a group given as a dict changes only the fields it names."""
    merged: dict[str, Any] = {**BASE, "run_dir": run_dir}
    for key, value in groups.items():
        merged[key] = {**BASE.get(key, {}), **value} if isinstance(value, dict) else value
    return TrainerConfig(**merged)


def weights(model: Any) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def test_fit_trains_publishes_and_records_everything(tokenizer: Any, tmp_path: Path) -> None:
    model = small_model(tokenizer)
    start = weights(model).clone()
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=4),
        credit=CreditConfig(mode="per_call"),
        config=config(tmp_path),
    )
    result = trainer.fit(parity_agent, TRAIN, VAL)

    assert result.steps == 2 and result.policy_version == 2 and result.resumed_from is None
    steps = [r for r in result.history if "train/reward" in r]
    # Weights move exactly when some group had different rewards (a flat group has zero advantages).
    assert (not torch.equal(weights(model), start)) == any(r["groups_flat"] < r["groups"] for r in steps)
    assert [r["step"] for r in steps] == [1, 2]
    assert [r["policy_version"] for r in steps] == [1, 2]
    for r in steps:
        assert r["train/rollouts"] == 8 and r["credit/transitions"] == 8 and r["tokens"] > 0
        assert 0.0 <= r["train/reward"] <= 1.0
    keys = {
        "val/success",
        "val/reward",
        "val/calls",
        "val/greedy_success",
        "val/greedy_reward",
        "val/greedy_calls",
    }
    assert set(result.val_before) == keys == set(result.val_after)
    # The parity agent makes one model call per episode: calls per held-out episode, not per step.
    assert result.val_before["val/calls"] == result.val_after["val/greedy_calls"] == 1.0
    # The parity reward is 0 or 1: the mean reward is the success rate.
    assert result.val_after["val/reward"] == pytest.approx(result.val_after["val/success"])
    assert (tmp_path / "metrics.jsonl").is_file() and (tmp_path / "reward_curve.png").is_file()
    assert (tmp_path / "store.db").is_file() and not (tmp_path / "store.url").exists()
    assert any((tmp_path / "tensorboard").iterdir())
    meta, _, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    assert meta.step == 2 and meta.policy_version == 2 and meta.sampler == {"epoch": 0, "position": 4}


def test_resume_continues_from_the_last_checkpoint(tokenizer: Any, tmp_path: Path) -> None:
    first = Trainer(small_model(tokenizer), tokenizer, algorithm=GRPO(group_size=4), config=config(tmp_path))
    first.fit(parity_agent, TRAIN, VAL)
    saved_meta, saved_policy, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]

    # A fresh process: new model object from the same warm start, more steps asked.
    model = small_model(tokenizer)
    resumed = Trainer(
        model, tokenizer, algorithm=GRPO(group_size=4), config=config(tmp_path, schedule={"max_steps": 3})
    )
    result = resumed.fit(parity_agent, TRAIN, VAL)
    assert result.resumed_from == 2 and result.steps == 3 and result.policy_version == 3
    steps = [r["step"] for r in result.history if "train/reward" in r]
    assert steps == [1, 2, 3]  # no step done twice, none skipped
    before = [r for r in result.history if r["step"] == 0]
    assert len(before) == 1  # the "before" validation is not redone on resume
    meta, policy_state, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    assert meta.sampler == {"epoch": 0, "position": 6}
    assert saved_meta.step == 2 and meta.step == 3
    changed = any(
        not torch.equal(saved_policy["model"][k], policy_state["model"][k]) for k in policy_state["model"]
    )
    # Step 3 moves the weights exactly when some step so far had a group with different rewards: a
    # flat group has zero advantages, so zero gradient, and Adam's momentum is zero until one isn't.
    learned = any(r["groups_flat"] < r["groups"] for r in result.history if "train/reward" in r)
    assert changed == learned


def test_resumed_state_equals_the_checkpoint(tokenizer: Any, tmp_path: Path) -> None:
    """Loading a checkpoint into a fresh policy restores the weights and the optimiser exactly."""
    from reinforge.training import OptimSettings
    from reinforge.training.policy import Policy

    Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=2),
        config=config(tmp_path, schedule={"max_steps": 1}),
    ).fit(parity_agent, TRAIN)
    _, state, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    policy = Policy(
        small_model(tokenizer), GRPO(group_size=2), OptimSettings(learning_rate=1e-2), pad_token_id=0
    )
    policy.load_state_dict(state)
    restored = policy.state_dict()
    assert all(torch.equal(restored["model"][k], v) for k, v in state["model"].items())
    for key, value in state["optimizer"]["state"][0].items():
        assert torch.equal(restored["optimizer"]["state"][0][key], value)


def test_trainer_rejects_bad_settings(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.raises(InvalidRequestError, match="trainer settings"):
        Trainer(small_model(tokenizer), tokenizer, run_dir=tmp_path, rollouts={"tasks_per_step": 0})
    with pytest.raises(InvalidRequestError, match="empty"):
        Trainer(small_model(tokenizer), tokenizer, run_dir=tmp_path).fit(parity_agent, [])


def test_a_dict_override_changes_only_the_fields_it_names(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(
        small_model(tokenizer), tokenizer, config=config(tmp_path), schedule={"max_steps": 7}, seed=3
    )
    assert trainer.config.schedule.max_steps == 7 and trainer.config.schedule.val_every == 0
    assert trainer.config.seed == 3 and trainer.config.rollouts.tasks_per_step == 2
    replaced = Trainer(
        small_model(tokenizer), tokenizer, config=config(tmp_path), schedule=ScheduleSettings()
    )
    assert replaced.config.schedule == ScheduleSettings()


def test_metrics_lines_are_json(tokenizer: Any, tmp_path: Path) -> None:
    Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=2),
        config=config(tmp_path, schedule={"max_steps": 1}),
    ).fit(parity_agent, TRAIN)
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert all(isinstance(json.loads(line), dict) for line in lines)


def test_lora_fit_trains_adapters_only(tokenizer: Any, tmp_path: Path) -> None:
    from reinforge.training import LoraSettings

    model = small_model(tokenizer)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    lora = LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=4),
        config=config(tmp_path, schedule={"max_steps": 1}, optim={"lora": lora}),
    )
    result = trainer.fit(parity_agent, TRAIN)
    assert result.policy_version == 1
    _, state, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    adapters = [k for k in state["model"] if "lora_" in k]
    assert adapters and any(
        not torch.equal(state["model"][k], torch.zeros_like(state["model"][k])) for k in adapters
    )
    # The frozen base weights did not move; only adapters trained.
    base = {
        k.replace("base_model.model.", "").replace(".base_layer", ""): v for k, v in state["model"].items()
    }
    assert all(torch.equal(base[k], v) for k, v in start.items() if k in base)


async def _store_snapshot(run_dir: Path) -> tuple[dict[str, int], list[tuple[str, int]]]:
    """Rollout counts by status, and (rollout id, policy version) of every recorded LLM call."""
    from reinforge import semconv
    from reinforge.store.factory import open_store
    from reinforge.types import SpanQuery

    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        counters = await store.counters()
        page = await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1000))
        calls = [(s.rollout_id or "", int(s.attributes[semconv.ATTR_POLICY_VERSION])) for s in page.items]
        return {k.value: v for k, v in counters.rollouts_by_status.items()}, calls
    finally:
        await store.close()


def _versions_by_step(calls: list[tuple[str, int]]) -> dict[int, set[int]]:
    """The policy versions that sampled each training step's calls (validation calls left out)."""
    versions: dict[int, set[int]] = {}
    for rollout_id, version in calls:
        if (step := re.search(r"-s(\d+)-", rollout_id)) is not None:
            versions.setdefault(int(step.group(1)), set()).add(version)
    return versions


def test_overlapped_rollouts_train_one_version_behind_and_leave_nothing_running(
    tokenizer: Any, tmp_path: Path
) -> None:
    import asyncio

    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=4),
        config=config(tmp_path, schedule={"max_steps": 3, "overlap_rollouts": True}),
    )
    result = trainer.fit(parity_agent, TRAIN)
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and result.policy_version == 3
    assert all(r["train/rollouts"] == 8 and r["credit/transitions"] == 8 for r in steps)
    by_status, calls = asyncio.run(_store_snapshot(tmp_path))
    # Three steps of 2 tasks x 4, each started before the previous update: nothing was started for a
    # step that did not run (max_steps bounds it), and nothing is left queued or running.
    assert by_status == {"succeeded": 24}
    versions = _versions_by_step(calls)
    # Step n's calls ran on version n - 2 (started during update n - 1) or n - 1 (after its publish).
    assert versions[1] == {0}
    for n in (2, 3):
        assert versions[n] <= {n - 2, n - 1}
    # The data position checkpointed is after the last trained step, not after one started ahead:
    # step 2's checkpoint was written with step 3's tasks already drawn.
    meta, _, _ = load_checkpoint(latest_checkpoint(tmp_path / "checkpoints"))  # type: ignore[arg-type]
    assert meta.sampler == {"epoch": 0, "position": 6}
    meta, _, _ = load_checkpoint(tmp_path / "checkpoints" / "step-000002")
    assert meta.step == 2 and meta.sampler == {"epoch": 0, "position": 4}


async def _step_times(run_dir: Path) -> dict[int, tuple[float, float]]:
    """Per training step: when its first attempt was leased, and when its last rollout ended."""
    from reinforge.store.factory import open_store
    from reinforge.types import AttemptQuery, RolloutQuery

    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        rollouts = (await store.query_rollouts(RolloutQuery(limit=1000))).items
        attempts = (await store.query_attempts(AttemptQuery(limit=1000))).items
    finally:
        await store.close()
    step_of = {r.rollout_id: int(r.rollout_id.split("-s")[1].split("-")[0]) for r in rollouts}
    times: dict[int, tuple[float, float]] = {}
    for step in set(step_of.values()):
        leased = min(a.started_at for a in attempts if step_of[a.rollout_id] == step)
        ended = max(r.finished_at or 0.0 for r in rollouts if step_of[r.rollout_id] == step)
        times[step] = (leased, ended)
    return times


@pytest.mark.parametrize("runner_concurrency", [16, 8], ids=["while-generating", "during-update"])
def test_prefetched_rollouts_start_early_yet_are_sampled_by_the_version_they_train(
    tokenizer: Any, tmp_path: Path, runner_concurrency: int
) -> None:
    """With room for two steps' rollouts (16 slots, 8 a step) the next step's agents start while this
    step generates; with room for one, during the update. Either way every call waits at the gateway
    for the version its step trains (strictly on-policy), and nothing is left behind."""
    import asyncio

    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=4),
        config=config(
            tmp_path,
            schedule={"max_steps": 3, "prefetch_rollouts": True},
            runners={"concurrency": runner_concurrency},
        ),
    )
    result = trainer.fit(parity_agent, TRAIN)
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["step"] for r in steps] == [1, 2, 3] and result.policy_version == 3
    assert all(r["train/rollouts"] == 8 and r["credit/transitions"] == 8 for r in steps)
    by_status, calls = asyncio.run(_store_snapshot(tmp_path))
    assert by_status == {"succeeded": 24}
    versions = _versions_by_step(calls)
    assert versions == {1: {0}, 2: {1}, 3: {2}}
    times = asyncio.run(_step_times(tmp_path))
    for step in (2, 3):
        leased, _ = times[step]
        _, previous_ended = times[step - 1]
        if runner_concurrency == 16:
            assert leased < previous_ended, "leased while the previous step was still generating"
        else:
            assert leased >= previous_ended, "one step's rollouts fill every slot: no early lease"
    meta, _, _ = load_checkpoint(tmp_path / "checkpoints" / "step-000002")
    assert meta.step == 2 and meta.sampler == {"epoch": 0, "position": 4}


def test_learning_rate_schedules() -> None:
    cosine = OptimSettings(learning_rate=1.0, lr_schedule="cosine", lr_final_ratio=0.2)
    assert [round(cosine.learning_rate_at(p), 6) for p in (0.0, 0.5, 1.0, 2.0)] == [1.0, 0.6, 0.2, 0.2]
    linear = OptimSettings(learning_rate=2.0, lr_schedule="linear", lr_final_ratio=0.0)
    assert [linear.learning_rate_at(p) for p in (-1.0, 0.25, 1.0)] == [2.0, 1.5, 0.0]
    assert OptimSettings(learning_rate=0.5).learning_rate_at(0.9) == 0.5  # constant, the default
    with pytest.raises(ValueError):
        OptimSettings(lr_schedule="step")  # type: ignore[arg-type]


def test_fit_decays_the_learning_rate_over_the_steps(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=2),
        config=config(
            tmp_path,
            schedule={"max_steps": 3},
            optim={"lr_schedule": "linear", "lr_final_ratio": 0.1},
            checkpoints={"every": 0},
        ),
    )
    result = trainer.fit(parity_agent, TRAIN)
    rates = [r["update/learning_rate"] for r in result.history if "train/reward" in r]
    assert rates == pytest.approx([1e-2, 7e-3, 4e-3])  # 1e-2 x (0.1 + 0.9 x (1 - done)), done = 0, 1/3, 2/3


def test_the_engine_can_run_in_its_own_process(tokenizer: Any, tmp_path: Path) -> None:
    """`engine_process=True`: the same on-policy fit with the engine in a child process (weights
    published through shared memory each step), and no child left when fit returns."""
    import asyncio
    import os

    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        algorithm=GRPO(group_size=4),
        config=config(
            tmp_path, schedule={"max_steps": 3, "prefetch_rollouts": True}, engine={"process": True}
        ),
    )
    result = trainer.fit(parity_agent, TRAIN, VAL)
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["policy_version"] for r in steps] == [1, 2, 3]
    assert set(result.val_after) == {
        "val/success",
        "val/reward",
        "val/calls",
        "val/greedy_success",
        "val/greedy_reward",
        "val/greedy_calls",
    }
    by_status, calls = asyncio.run(_store_snapshot(tmp_path))
    assert by_status["succeeded"] == 24 + 2 * 2 * len(VAL)  # training, and validation before and after
    versions = _versions_by_step(calls)
    assert versions == {1: {0}, 2: {1}, 3: {2}}
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == os.getpid() and b"reinforge.engine.process" in cmdline:
            children.append(stat.parent.name)
    assert children == []


def test_fit_on_a_served_store(tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`store_url` naming a `reinforge store serve` server: the trainer's loop and the gateway's
    thread share one HTTP client (each loop on its own connections), and everything lands there."""
    import asyncio
    import uuid

    from reinforge.net.background import BackgroundServer
    from reinforge.store import SqlStore
    from reinforge.store.http.server import create_store_app

    served = tmp_path / "served"
    served.mkdir()

    async def open_backend() -> SqlStore:
        return await SqlStore.open(f"sqlite:///{served / 'store.db'}")

    token = uuid.uuid4().hex
    server = BackgroundServer(create_store_app(open_backend, token))
    server.start()
    try:
        monkeypatch.delenv("REINFORGE_STORE_TOKEN", raising=False)
        trainer = Trainer(
            small_model(tokenizer),
            tokenizer,
            algorithm=GRPO(group_size=4),
            config=config(
                tmp_path / "run",
                store={"url": server.url, "token": token},
                schedule={"prefetch_rollouts": True},
            ),
        )
        result = trainer.fit(parity_agent, TRAIN, VAL)
    finally:
        server.stop()
    steps = [r for r in result.history if "train/reward" in r]
    assert [r["policy_version"] for r in steps] == [1, 2]
    assert all(r["train/rollouts"] == 8 and r["credit/transitions"] == 8 for r in steps)
    assert not (tmp_path / "run" / "store.db").exists()  # nothing went to a local store
    by_status, calls = asyncio.run(_store_snapshot(served))
    assert by_status["succeeded"] == 16 + 2 * 2 * len(VAL)
    assert _versions_by_step(calls) == {1: {0}, 2: {1}}
