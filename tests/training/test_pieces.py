"""Micro-batching, the task sampler, checkpoints and the metrics log."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from reinforge.errors import InvalidRequestError
from reinforge.training.checkpoint import (
    CheckpointMeta,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
    set_rng_state,
)
from reinforge.training.data import TaskSampler
from reinforge.training.metrics import MetricsLog, plot_reward_curve
from reinforge.training.microbatch import micro_batches
from reinforge.types import Transition


def _t(prompt: int, response: int) -> Transition:
    return Transition(
        rollout_id="r",
        attempt_id="a",
        prompt_ids=[1] * prompt,
        response_ids=[2] * response,
        response_mask=[1] * response,
        behaviour_logprobs=[0.0] * response,
    )


def test_micro_batches_respect_the_padded_token_budget() -> None:
    rng = random.Random(0)
    ts = [_t(rng.randint(5, 60), rng.randint(1, 40)) for _ in range(50)]
    groups = micro_batches(ts, 300)
    assert sorted(i for g in groups for i in g) == list(range(50))
    for g in groups:
        width = max(len(ts[i].prompt_ids) + len(ts[i].response_ids) for i in g)
        assert width * len(g) <= 300
    # An over-long transition still gets trained, alone.
    assert micro_batches([_t(500, 10), _t(5, 5)], 100) == [[0], [1]]
    with pytest.raises(InvalidRequestError):
        micro_batches(ts, 0)


def test_sampler_covers_each_epoch_and_resumes_exactly() -> None:
    sampler = TaskSampler(10, seed=3)
    first = sampler.next_batch(4) + sampler.next_batch(4) + sampler.next_batch(2)
    assert sorted(first) == list(range(10))
    sampler.next_batch(3)
    saved = sampler.state_dict()
    expected = [sampler.next_batch(4) for _ in range(5)]
    resumed = TaskSampler(10, seed=3)
    resumed.load_state_dict(saved)
    assert [resumed.next_batch(4) for _ in range(5)] == expected
    assert TaskSampler(10, seed=4).next_batch(10) != first
    with pytest.raises(InvalidRequestError):
        TaskSampler(0)


def test_checkpoint_round_trip_restores_weights_optimiser_and_rng(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    opt.step()
    random.seed(5)
    np.random.seed(5)
    torch.manual_seed(5)
    meta = CheckpointMeta(step=3, policy_version=3, sampler={"epoch": 1, "position": 2}, rl_seconds=12.5)
    save_checkpoint(tmp_path, meta, {"model": model.state_dict(), "optimizer": opt.state_dict()})
    after = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    loaded_meta, state, rng = load_checkpoint(latest_checkpoint(tmp_path))  # type: ignore[arg-type]
    assert loaded_meta == meta
    fresh = torch.nn.Linear(4, 2)
    fresh.load_state_dict(state["model"])
    assert torch.equal(fresh.weight, model.weight)
    fresh_opt = torch.optim.AdamW(fresh.parameters(), lr=0.1)
    fresh_opt.load_state_dict(state["optimizer"])
    assert torch.equal(fresh_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    set_rng_state(rng)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == after


def test_only_the_newest_checkpoints_are_kept_and_partial_ones_ignored(tmp_path: Path) -> None:
    for step in range(1, 5):
        meta = CheckpointMeta(step=step, policy_version=step, sampler={})
        save_checkpoint(tmp_path, meta, {"x": torch.zeros(1)}, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-000003", "step-000004"]
    (tmp_path / "step-000009").mkdir()  # a folder without the state file: a crash mid-write
    assert latest_checkpoint(tmp_path).name == "step-000004"  # type: ignore[union-attr]
    with pytest.raises(InvalidRequestError):
        load_checkpoint(tmp_path / "step-000009")


def test_metrics_log_truncates_on_resume_and_plots(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    log.log(0, {"val/success": 0.2, "val/greedy_success": 0.1})
    for step in range(1, 6):
        log.log(step, {"train/reward": step / 10, "train/success": step / 10})
    log.truncate_after(3)
    assert [r["step"] for r in log.records()] == [0, 1, 2, 3]
    log.log(4, {"train/reward": 0.9, "val/success": 0.8})
    log.close()
    png = plot_reward_curve(log.records(), tmp_path / "curve.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(InvalidRequestError):
        plot_reward_curve([{"step": 0, "val/success": 0.1}], tmp_path / "none.png")


def test_metrics_log_writes_every_numeric_value_to_tensorboard(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricsLog(tmp_path)
    for step in range(1, 4):
        log.log(step, {"train/reward": step / 10, "tokens": 100 * step, "flag": True, "note": "x"})
    log.log(4, {"train/reward": float("nan"), "val/success": 0.75})
    log.close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["tokens", "train/reward", "val/success"]
    reward = [(e.step, round(e.value, 6)) for e in events.Scalars("train/reward")]
    assert reward == [(1, 0.1), (2, 0.2), (3, 0.3)]  # the NaN of step 4 is left out
    assert [(e.step, e.value) for e in events.Scalars("tokens")] == [(1, 100.0), (2, 200.0), (3, 300.0)]
    assert [(e.step, e.value) for e in events.Scalars("val/success")] == [(4, 0.75)]
