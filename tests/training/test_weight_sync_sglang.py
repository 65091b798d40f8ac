"""Weight sync into SGLang, against a fake SGLang server (real tiny model on CPU, the recorded request
and response formats) over HTTP on 127.0.0.1: `/update_weights_from_disk` with a folder per version,
LoRA adapters hot-loaded under versioned names, refusals, and a short `Trainer.fit`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from inference.fake_servers import FakeSglang, Weights
from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.net.background import BackgroundServer
from reinforge.stack.weight_sync import WeightSyncError
from reinforge.training import Trainer

from .conftest import parity_agent, small_model
from .serving_harness import (
    LORA,
    assert_one_version_per_call,
    call,
    calls_during,
    make_policy,
    merged,
    nudge,
    same_weights,
    span_versions,
    stack_on,
)


def full_version(tag: str) -> int:
    return int(tag.removeprefix("full-"))


async def test_sglang_full_sync_switches_between_calls_never_during_one(
    tokenizer: Any, tmp_path: Path
) -> None:
    model = small_model(tokenizer)
    fake = FakeSglang(model, tokenizer)
    policy = make_policy(model, tokenizer)
    async with stack_on(fake, model, tokenizer, tmp_path, backend="sglang") as (stack, store):

        async def two_updates() -> None:
            for version in (1, 2):
                nudge(policy, version)
                await stack.publish(policy, version)

        await calls_during(stack, store, two_updates)
        spans = await span_versions(stack, store)
    assert_one_version_per_call(fake, full_version, spans)
    assert spans[0] > 0 and spans[2] > 0
    assert same_weights(fake.weights.model, policy.model) and fake.weight_version == "2"
    weights = tmp_path / "weights"
    updates = [body for path, body in fake.requests if path == "/update_weights_from_disk"]
    assert updates == [
        {"model_path": str(weights / "policy-v1"), "weight_version": "1"},
        {"model_path": str(weights / "policy-v2"), "weight_version": "2"},
    ]
    # The version the server no longer serves is deleted; the one it serves stays.
    assert not (weights / "policy-v1").exists() and (weights / "policy-v2" / "config.json").is_file()


async def test_sglang_refused_sync_keeps_the_old_version_and_quotes_the_server(
    tokenizer: Any, tmp_path: Path
) -> None:
    model = small_model(tokenizer)
    fake = FakeSglang(model, tokenizer)
    policy = make_policy(model, tokenizer)
    async with stack_on(fake, model, tokenizer, tmp_path, backend="sglang") as (stack, store):
        nudge(policy, 1)
        fake.fail("/update_weights_from_disk", "refuse")
        with pytest.raises(
            WeightSyncError, match=r"answered 400: Failed to get weights iterator: the checkpoint"
        ):
            await stack.publish(policy, 1)
        fake.fail("/update_weights_from_disk", "error")
        with pytest.raises(WeightSyncError, match=r"answered 500: Internal Server Error"):
            await stack.publish(policy, 1)
        await call(stack, store, "1+1")
        assert dict(await span_versions(stack, store)) == {0: 1}
        nudge(policy, 2)
        await stack.publish(policy, 1)  # the next try goes through
        await call(stack, store, "2+2")
        assert dict(await span_versions(stack, store)) == {0: 1, 1: 1}
    assert fake.served_tags() == ["full-0", "full-1"]
    assert [s.applied for s in fake.syncs] == [False, False, True]


async def test_sglang_lora_sync_hot_loads_a_versioned_adapter_and_unloads_the_last(
    tokenizer: Any, tmp_path: Path
) -> None:
    model = small_model(tokenizer)
    fake = FakeSglang(model, tokenizer)
    policy = make_policy(model, tokenizer, lora=True)
    fake.adapters["policy-v1"] = Weights(fake.base, "stale")  # left loaded by an earlier run
    served: dict[int, Any] = {}
    async with stack_on(fake, model, tokenizer, tmp_path, backend="sglang", sync="lora") as (stack, store):

        async def two_updates() -> None:
            for version in (1, 2):
                nudge(policy, version)
                await stack.publish(policy, version)
                served[version] = merged(policy)

        await calls_during(stack, store, two_updates)
        fake.fail("/load_lora_adapter", "refuse")
        nudge(policy, 3)
        with pytest.raises(WeightSyncError, match=r"answered 400: Failed to load LoRA adapter policy-v3"):
            await stack.publish(policy, 3)
        await call(stack, store, "after the refusal")
        spans = await span_versions(stack, store)
    version_of = {"full-0": 0, "policy-v1": 1, "policy-v2": 2}
    assert_one_version_per_call(fake, version_of.__getitem__, spans)
    assert set(fake.adapters) == {"policy-v2"}  # v3 was refused: v2 still serves
    assert same_weights(fake.adapters["policy-v2"].model, served[2])
    adapters = [(p, b) for p, b in fake.requests if "lora_adapter" in p]
    # Each load is preceded by an unload of its own name (a stale adapter of an earlier run).
    assert [(p, b["lora_name"]) for p, b in adapters] == [
        ("/unload_lora_adapter", "policy-v1"),
        ("/load_lora_adapter", "policy-v1"),
        ("/unload_lora_adapter", "policy-v2"),
        ("/load_lora_adapter", "policy-v2"),
        ("/unload_lora_adapter", "policy-v1"),
        ("/unload_lora_adapter", "policy-v3"),
        ("/load_lora_adapter", "policy-v3"),
    ]
    generated = [b.get("lora_path") for p, b in fake.requests if p == "/generate"]
    assert generated[-1] == "policy-v2" and set(generated) <= {None, "policy-v1", "policy-v2"}


def test_sglang_lora_trainer_fit_syncs_once_per_step(tokenizer: Any, tmp_path: Path) -> None:
    model = small_model(tokenizer)
    fake = FakeSglang(copy.deepcopy(model), tokenizer)
    with BackgroundServer(fake.app()) as upstream:
        trainer = Trainer(
            model,
            tokenizer,
            algorithm=GRPO(group_size=2),
            credit=CreditConfig(mode="per_call"),
            run_dir=tmp_path,
            progress=False,
            optim={"learning_rate": 1e-2, "lora": LORA.model_dump()},
            rollouts={"tasks_per_step": 2, "max_tokens": 6},
            schedule={"max_steps": 2, "val_every": 0},
            engine={
                "backend": "sglang",
                "url": upstream.url,
                "weights_dir": tmp_path / "weights",
                "sync": "lora",
            },
        )
        result = trainer.fit(parity_agent, [{"task_id": f"t{i}", "question": f"{i}+{i}"} for i in range(8)])
    assert result.steps == 2 and result.policy_version == 2
    loads = [b["lora_name"] for p, b in fake.requests if p == "/load_lora_adapter"]
    assert loads == ["policy-v1", "policy-v2"]  # one sync per step
    assert set(fake.adapters) == {"policy-v2"}
    assert "MIXED" not in fake.served_tags() and fake.overlaps() == []
    assert sorted(set(fake.served_tags())) == ["full-0", "policy-v1"]
