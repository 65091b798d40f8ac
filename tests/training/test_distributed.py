"""Data-parallel updates (torch.distributed, gloo on CPU, 127.0.0.1): two processes each computing
half of a step's rows end with the weights one process gets from the whole batch; `reinforge train
--nproc 2` runs a real fit; the shares are balanced by tokens; misuse is a clear error."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp

from reinforge.algorithms import GRPO, PPO, compute_advantages
from reinforge.errors import InvalidRequestError
from reinforge.training.config import DistributedSettings, LoraSettings, OptimSettings
from reinforge.training.device import CPU
from reinforge.training.distributed import (
    LeaderOrder,
    follow_leader,
    free_port,
    join_data_parallel,
    shard_by_tokens,
)
from reinforge.training.microbatch import transition_length
from reinforge.training.policy import Policy
from reinforge.training.trainer import Trainer
from reinforge.types import Transition

from .conftest import small_model
from .test_policy import transitions as policy_transitions
from .test_train_cli import write_run

ALGORITHM = GRPO(group_size=4, loss_agg="seq-mean-token-mean", seq_unit="rollout")
OPTIM = OptimSettings(learning_rate=1e-4, micro_batch_tokens=64)
"""Micro-batches of a few rows, and loss scales that depend on the whole batch's rollouts: a rank
normalising by its own share would get other gradients. AdamW's first step is about lr * g / (|g| +
eps), which turns a float-order difference in a gradient near eps (1e-8) into lr/eps times as much in
the weight; lr 1e-4 keeps that under the tolerance, and the gradients are compared as well."""


def step_batch(model: Any, pad: int) -> list[Transition]:
    """Three GRPO groups of four rollouts with real on-policy logprobs and computed advantages; one
    group is flat (every reward equal), so its rows carry no signal and are skipped."""
    batch: list[Transition] = []
    for g in range(3):
        group = policy_transitions(model, pad, n=4, seed=10 + g)
        for i, t in enumerate(group):
            reward = 1.0 if g == 2 else float((i + g) % 2)
            batch.append(
                t.model_copy(update={"rollout_id": f"g{g}r{i}", "group_id": f"g{g}", "reward": reward})
            )
    compute_advantages(batch, ALGORITHM)
    return batch


ROLES_OPTIM = OPTIM.model_copy(update={"lora": LoraSettings(r=4, roles=["solver", "checker"])})
"""Per-role adapters: "checker" has one row with a signal, so only one rank computes its adapter's
gradient and the other contributes zeros; the flat group's rows belong to "solver"."""


def role_batch(batch: list[Transition]) -> list[Transition]:
    return [
        t.model_copy(update={"agent_name": "checker" if t.rollout_id == "g1r0" else "solver"}) for t in batch
    ]


def new_policy(model: Any, optim: OptimSettings, pad: int, data_parallel: Any = None) -> Policy:
    torch.manual_seed(7)  # LoRA's initialisation: the same in every process (a fit broadcasts it)
    return Policy(copy.deepcopy(model), ALGORITHM, optim, pad_token_id=pad, data_parallel=data_parallel)


def snapshot(policy: Policy, metrics: dict[str, float]) -> dict[str, Any]:
    named = list(policy.model.named_parameters())
    return {
        "params": {k: v.detach().clone() for k, v in named},
        "grads": {k: v.grad.clone() for k, v in named if v.grad is not None},
        "metrics": metrics,
    }


def _rank_main(rank: int, port: int, out_dir: str, batch: list[Transition], model: Any, pad: int) -> None:
    """One of two gloo processes: rank 0 leads each update, rank 1 follows; each saves its weights.
    (`copy.deepcopy` in `new_policy`: tensors handed to spawned processes share the parent's memory.)"""
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"}
    )
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dp = join_data_parallel(DistributedSettings(backend="gloo", timeout_minutes=2), CPU)
    assert dp is not None and dp.rank == rank
    results = {}
    try:
        for name, optim, rows in (("full", OPTIM, batch), ("roles", ROLES_OPTIM, role_batch(batch))):
            policy = new_policy(model, optim, pad, dp)
            if dp.is_leader:
                metrics = policy.update(rows)
                dp.send(LeaderOrder(kind="stop"))
            else:
                assert follow_leader(policy, dp) == 1
                metrics = {}
            results[name] = snapshot(policy, metrics)
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dp.close()


def assert_same_step(alone: Policy, ranks: list[dict[str, Any]], start: dict[str, torch.Tensor]) -> int:
    """Every rank's summed gradients and weights after the step equal one process's; returns how many
    parameter tensors the step moved."""
    moved = 0
    for name, value in alone.model.named_parameters():
        moved += not torch.equal(value.detach(), start[name])
        assert (value.grad is None) == all(name not in rank["grads"] for rank in ranks), name
        for rank in ranks:  # the summed gradients (clipped, as stepped), and the weights after the step
            if value.grad is not None:
                torch.testing.assert_close(rank["grads"][name], value.grad, rtol=1e-4, atol=1e-7, msg=name)
            torch.testing.assert_close(rank["params"][name], value.detach(), rtol=0, atol=1e-6, msg=name)
    return moved


def test_distributed_two_processes_on_half_batches_match_one_process_on_the_whole(
    tokenizer: Any, tmp_path: Path
) -> None:
    pad = tokenizer.pad_token_id
    model = small_model(tokenizer, seed=3)
    batch = step_batch(model, pad)
    trained = [i for i, t in enumerate(batch) if t.advantage != 0.0]
    shares = shard_by_tokens([transition_length(batch[i]) for i in trained], 2)
    assert all(shares) and sum(map(len, shares)) == len(trained) == 8  # each rank computes half

    mp.spawn(_rank_main, args=(free_port(), str(tmp_path), batch, model, pad), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]

    alone = new_policy(model, OPTIM, pad)
    start = {k: v.detach().clone() for k, v in alone.model.named_parameters()}
    single = alone.update(batch)
    full = [rank["full"] for rank in ranks]
    assert assert_same_step(alone, full, start) == len(start)  # every weight tensor moved
    leader = full[0]["metrics"]
    assert leader["update/grad_norm"] == pytest.approx(single["update/grad_norm"], rel=1e-5)
    assert leader["loss/policy"] == pytest.approx(single["loss/policy"], rel=1e-4, abs=1e-7)
    assert leader["tokens"] == single["tokens"]
    assert leader["update/micro_batches"] >= 2
    assert leader["update/transitions"] == single["update/transitions"] == 12
    assert leader["update/rows_without_signal"] == single["update/rows_without_signal"] == 4

    alone = new_policy(model, ROLES_OPTIM, pad)
    start = {k: v.detach().clone() for k, v in alone.model.named_parameters()}
    single = alone.update(role_batch(batch))
    roles = [rank["roles"] for rank in ranks]
    assert assert_same_step(alone, roles, start) > 0
    for rank in roles:  # the frozen base stayed, the checker's adapter has its one row's gradient
        assert all(torch.equal(v, start[k]) for k, v in rank["params"].items() if "lora_" not in k)
        assert any(".checker." in k and g.abs().sum() > 0 for k, g in rank["grads"].items())
    assert roles[0]["metrics"]["update/transitions/checker"] == single["update/transitions/checker"] == 1
    assert roles[0]["metrics"]["update/grad_norm"] == pytest.approx(single["update/grad_norm"], rel=1e-5)


def _fsdp_rank_main(
    rank: int, port: int, out_dir: str, batches: list[list[Transition]], model: Any, pad: int
) -> None:
    """One of two gloo processes with FSDP2 sharding: a step, the gathers a publish and a checkpoint
    make, then a resume from that checkpoint (every rank loads the file, then shards) and a second
    step on `batches[1]`."""
    batch, second_batch = batches
    os.environ.update(
        {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1"}
    )
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    settings = DistributedSettings(backend="gloo", timeout_minutes=2, sharding="fsdp2")
    dp = join_data_parallel(settings, CPU)
    assert dp is not None and dp.sharding == "fsdp2"
    checkpoint = Path(out_dir) / "checkpoint.pt"
    try:
        policy = new_policy(model, OPTIM, pad, dp)
        policy.shard()
        if dp.is_leader:
            metrics = policy.update(batch)
            engine = policy.engine_state()
            torch.save(policy.state_dict(), checkpoint)
            dp.send(LeaderOrder(kind="stop"))
        else:
            assert follow_leader(policy, dp) == 1
            metrics, engine = {}, {}
        shards = {k: type(v).__name__ for k, v in policy.model.named_parameters()}
        dp.gather_objects(None)  # the checkpoint is written
        resumed = new_policy(model, OPTIM, pad, dp)
        resumed.load_state_dict(torch.load(checkpoint))
        resumed.shard()
        if dp.is_leader:
            second = resumed.update(second_batch)
            final = resumed.state_dict()
            dp.send(LeaderOrder(kind="stop"))
        else:
            assert follow_leader(resumed, dp) == 1
            second, final = {}, {}
        result = {"metrics": metrics, "engine": engine, "shards": shards, "second": second, "final": final}
        torch.save(result, Path(out_dir) / f"fsdp{rank}.pt")
    finally:
        dp.close()


def test_distributed_fsdp2_step_matches_single_process(tokenizer: Any, tmp_path: Path) -> None:
    """FSDP2 on two gloo processes: the step on half-batches gives the one-process weights (as the
    engine and a checkpoint get them), AdamW's state, and after a resume a second step that matches
    the one process's second step."""
    pad = tokenizer.pad_token_id
    model = small_model(tokenizer, seed=3)
    batch = step_batch(model, pad)
    # One row with a signal and the flat group: one rank computes it, the other makes a zero-loss
    # pass so that both join the same collectives.
    second_batch = batch[:1] + batch[8:]
    assert [t.advantage != 0.0 for t in second_batch] == [True, False, False, False, False]
    batches = [batch, second_batch]
    mp.spawn(_fsdp_rank_main, args=(free_port(), str(tmp_path), batches, model, pad), nprocs=2, join=True)
    leader, follower = (torch.load(tmp_path / f"fsdp{r}.pt") for r in range(2))
    saved = torch.load(tmp_path / "checkpoint.pt")
    assert set(leader["shards"].values()) == {"DTensor"} and follower["engine"] == {}

    alone = new_policy(model, OPTIM, pad)
    single = alone.update(batch)
    expected = alone.state_dict()
    assert set(leader["engine"]) == set(expected["model"])
    for name, value in expected["model"].items():
        torch.testing.assert_close(leader["engine"][name], value, rtol=0, atol=1e-6, msg=name)
        torch.testing.assert_close(saved["model"][name], value, rtol=0, atol=1e-6, msg=name)
    optimizer = saved["optimizer"]  # numbered as the unsharded optimiser numbers its parameters
    assert optimizer["param_groups"][0]["params"] == expected["optimizer"]["param_groups"][0]["params"]
    for index, state in expected["optimizer"]["state"].items():
        exp_avg = optimizer["state"][index]["exp_avg"]
        torch.testing.assert_close(exp_avg, state["exp_avg"], rtol=1e-4, atol=1e-9, msg=str(index))
        assert float(optimizer["state"][index]["step"]) == float(state["step"]) == 1.0
    assert leader["metrics"]["update/grad_norm"] == pytest.approx(single["update/grad_norm"], rel=1e-5)
    assert leader["metrics"]["loss/policy"] == pytest.approx(single["loss/policy"], rel=1e-4, abs=1e-7)
    assert leader["metrics"]["update/transitions"] == single["update/transitions"] == 12

    second = alone.update(second_batch)  # the resumed ranks' second step = this process's second
    assert leader["second"]["update/grad_norm"] == pytest.approx(second["update/grad_norm"], rel=1e-4)
    after = alone.state_dict()
    for name, value in after["model"].items():
        torch.testing.assert_close(leader["final"]["model"][name], value, rtol=0, atol=2e-6, msg=name)
    assert all(float(s["step"]) == 2.0 for s in leader["final"]["optimizer"]["state"].values())


def test_distributed_fsdp2_refuses_lora_and_ppo_before_anything_starts(
    tokenizer: Any, tmp_path: Path
) -> None:
    model = small_model(tokenizer)
    with pytest.raises(InvalidRequestError, match=r"fsdp2.*optim\.lora"):
        Trainer(model, tokenizer, run_dir=tmp_path, distributed={"sharding": "fsdp2"}, optim=ROLES_OPTIM)
    with pytest.raises(InvalidRequestError, match=r"fsdp2.*PPO"):
        Trainer(model, tokenizer, run_dir=tmp_path, algorithm=PPO(), distributed={"sharding": "fsdp2"})
    # a Policy built outside a Trainer refuses too (no process group needed: the check comes first)
    with pytest.raises(InvalidRequestError, match="fsdp2"):
        new_policy(model, ROLES_OPTIM, tokenizer.pad_token_id, SimpleNamespace(sharding="fsdp2"))
    assert not list(tmp_path.iterdir())  # refused before anything was written


def test_distributed_shares_are_balanced_by_tokens_and_deterministic() -> None:
    lengths = [100, 10, 10, 10, 10, 10, 10, 10, 10, 10, 10, 90]
    shares = shard_by_tokens(lengths, 2)
    loads = [sum(lengths[i] for i in share) for share in shares]
    assert sorted(i for share in shares for i in share) == list(range(len(lengths)))
    assert loads == [150, 140]  # a split by count (six rows each) could be 190 / 100
    assert shards_sorted(shares) and shard_by_tokens(lengths, 2) == shares
    assert shard_by_tokens([5], 3) == [[0], [], []]  # fewer rows than ranks: the others get none
    with pytest.raises(InvalidRequestError):
        shard_by_tokens([1], 0)


def shards_sorted(shares: list[list[int]]) -> bool:
    return all(share == sorted(share) for share in shares)


def test_distributed_nproc_without_a_launcher_is_a_clear_error(tokenizer: Any, tmp_path: Path) -> None:
    trainer = Trainer(
        small_model(tokenizer), tokenizer, run_dir=tmp_path / "run", distributed={"nproc": 2}, progress=False
    )
    with pytest.raises(InvalidRequestError, match="--nproc 2"):
        trainer.fit(lambda task, llm: 0.0, [{"question": "1+1"}])
    assert not (tmp_path / "run" / "store.db").exists()  # refused before anything started


def test_distributed_train_command_with_nproc_2_completes_a_fit(tokenizer: Any, tmp_path: Path) -> None:
    config = write_run(tmp_path, tokenizer)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run(
        [sys.executable, "-m", "reinforge", "train", str(config), "--nproc", "2", "--max-steps", "1"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("trained 1 steps (policy v1)") == 1, done.stdout  # rank 0 alone reports
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in records if "train/reward" in r)
    assert step["step"] == 1 and step["policy_version"] == 1
    assert step["update/transitions"] >= 1 and step["update/grad_norm"] >= 0.0
    assert (tmp_path / "out" / "checkpoints").is_dir()  # rank 0 checkpointed
