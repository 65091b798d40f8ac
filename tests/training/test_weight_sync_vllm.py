"""Weight sync into vLLM, against a fake vLLM server (real tiny model on CPU, the recorded request and
response formats) over HTTP on 127.0.0.1: full weights through `/collective_rpc` reload_weights, LoRA
adapters hot-loaded under versioned names, failures, and a short `Trainer.fit`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from inference.fake_servers import FakeVllm, Weights
from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.net.background import BackgroundServer
from reinforge.stack.weight_sync import WeightSyncError
from reinforge.training import Trainer, TrainerConfig

from .conftest import parity_agent, small_model
from .serving_harness import (
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


def fake_vllm(model: Any, tokenizer: Any, run_dir: Path) -> FakeVllm:
    """A fake `vllm serve <run_dir>/weights`: the folder holds the starting model, as the docs say."""
    folder = run_dir / "weights"
    model.save_pretrained(folder)
    fake = FakeVllm(model, tokenizer)
    fake.model_dir = folder
    return fake


def full_version(tag: str) -> int:
    return int(tag.removeprefix("full-"))


async def test_vllm_full_sync_switches_between_calls_never_during_one(tokenizer: Any, tmp_path: Path) -> None:
    model = small_model(tokenizer)
    fake = fake_vllm(model, tokenizer, tmp_path)
    policy = make_policy(model, tokenizer)
    async with stack_on(fake, model, tokenizer, tmp_path, backend="vllm") as (stack, store):

        async def two_updates() -> None:
            for version in (1, 2):
                nudge(policy, version)
                await stack.publish(policy, version)

        await calls_during(stack, store, two_updates)
        spans = await span_versions(stack, store)
    assert_one_version_per_call(fake, full_version, spans)
    assert spans[0] > 0 and spans[2] > 0  # calls ran before, and after, the updates
    assert same_weights(fake.weights.model, policy.model)  # the server serves the trained weights
    control = [(path, body) for path, body in fake.requests if not path.startswith("/v1/chat")]
    reload = ("/collective_rpc", {"method": "reload_weights"})
    assert control == [reload, ("/reset_prefix_cache", None)] * 2


async def test_vllm_failed_sync_keeps_the_old_version_and_quotes_the_server(
    tokenizer: Any, tmp_path: Path
) -> None:
    model = small_model(tokenizer)
    fake = fake_vllm(model, tokenizer, tmp_path)
    policy = make_policy(model, tokenizer)
    async with stack_on(fake, model, tokenizer, tmp_path, backend="vllm", sync_timeout_s=1.0) as (
        stack,
        store,
    ):
        nudge(policy, 1)
        fake.fail("/collective_rpc", "error")
        with pytest.raises(WeightSyncError, match=r"answered 500: RuntimeError: injected error"):
            await stack.publish(policy, 1)
        fake.hang_s = 2.5
        fake.fail("/collective_rpc", "hang")
        with pytest.raises(WeightSyncError, match=r"did not answer within 1s"):
            await stack.publish(policy, 1)
        await call(stack, store, "1+1")  # the gateway serves again, on the old weights
        assert stack.backend.policy_version == 0  # type: ignore[attr-defined]
        assert same_weights(fake.weights.model, model)
        assert dict(await span_versions(stack, store)) == {0: 1}
    assert fake.served_tags() == ["full-0"]


async def test_vllm_retry_setting_retries_a_failed_sync(tokenizer: Any, tmp_path: Path) -> None:
    model = small_model(tokenizer)
    fake = fake_vllm(model, tokenizer, tmp_path)
    policy = make_policy(model, tokenizer)
    settings = {"backend": "vllm", "on_sync_failure": "retry", "sync_retries": 2, "sync_retry_delay_s": 0.0}
    async with stack_on(fake, model, tokenizer, tmp_path, **settings) as (stack, store):
        nudge(policy, 1)
        fake.fail("/collective_rpc", "error")
        await stack.publish(policy, 1)
        await call(stack, store, "2+2")
        assert dict(await span_versions(stack, store)) == {1: 1}
    assert [s.applied for s in fake.syncs] == [False, True]
    assert same_weights(fake.weights.model, policy.model)


async def test_vllm_lora_sync_hot_loads_a_versioned_adapter_and_unloads_the_last(
    tokenizer: Any, tmp_path: Path
) -> None:
    model = small_model(tokenizer)
    fake = fake_vllm(model, tokenizer, tmp_path)
    policy = make_policy(model, tokenizer, lora=True)
    fake.adapters["policy-v1"] = Weights(fake.base, "stale")  # left loaded by an earlier run
    async with stack_on(fake, model, tokenizer, tmp_path, backend="vllm", sync="lora") as (stack, store):

        async def two_updates() -> None:
            for version in (1, 2):
                nudge(policy, version)
                await stack.publish(policy, version)

        await calls_during(stack, store, two_updates)
        spans = await span_versions(stack, store)
    version_of = {"full-0": 0, "policy-v1": 1, "policy-v2": 2}
    assert_one_version_per_call(fake, version_of.__getitem__, spans)
    assert set(fake.adapters) == {"policy-v2"}
    assert same_weights(fake.adapters["policy-v2"].model, merged(policy))
    control = [(p, b) for p, b in fake.requests if "lora_adapter" in p]
    weights = tmp_path / "weights"
    assert control == [
        ("/v1/unload_lora_adapter", {"lora_name": "policy-v1"}),  # the earlier run's, at start-up
        ("/v1/load_lora_adapter", {"lora_name": "policy-v1", "lora_path": str(weights / "policy-v1")}),
        ("/v1/load_lora_adapter", {"lora_name": "policy-v2", "lora_path": str(weights / "policy-v2")}),
        ("/v1/unload_lora_adapter", {"lora_name": "policy-v1"}),
    ]
    chats = [b["model"] for p, b in fake.requests if p == "/v1/chat/completions"]
    assert chats[-1] == "policy-v2" and set(chats) <= {"reinforge-policy", "policy-v1", "policy-v2"}
    assert not (weights / "policy-v1").exists() and (weights / "policy-v2" / "adapter_config.json").is_file()


async def test_vllm_check_names_what_to_fix(tokenizer: Any, tmp_path: Path) -> None:
    model = small_model(tokenizer)
    fake = fake_vllm(model, tokenizer, tmp_path)
    with pytest.raises(WeightSyncError, match=r"serves \['reinforge-policy'\], not 'other'"):
        async with stack_on(fake, model, tokenizer, tmp_path, backend="vllm", served_model="other"):
            pass


def test_vllm_settings_refuse_what_the_backend_cannot_honour(tmp_path: Path) -> None:
    server = {"backend": "vllm", "url": "http://h:1", "weights_dir": tmp_path}
    refused: list[tuple[dict[str, Any], str]] = [
        ({"engine": {"backend": "vllm"}}, r"needs \['url'\]"),
        ({"engine": {"backend": "vllm", "url": "http://h:1"}}, r"needs \['weights_dir'\]"),
        ({"engine": {"backend": "scripted", "scripted": "r.json"}}, r"can't serve a policy in training"),
        ({"engine": {"model_dir": "m"}}, r"model_dir is for `reinforge store serve`"),
        ({"engine": {**server, "sync": "lora"}}, r"needs optim.lora"),
        ({"engine": {"url": "http://h:1"}}, r"are for backend 'vllm' or 'sglang'"),
        ({"engine": {**server, "max_batch_size": 8}}, r"\['max_batch_size'\] are the embedded engine's"),
        ({"engine": {**server, "weights_dir": "policy"}}, r"weights_dir must be an absolute path"),
        (
            {"optim": {"lora": {"roles": ["solver", "checker"]}}, "engine": server},
            r"served by the embedded engine only",
        ),
    ]
    for settings, message in refused:
        with pytest.raises(ValueError, match=message):
            TrainerConfig.model_validate(settings)


def test_vllm_trainer_fit_syncs_once_per_step(tokenizer: Any, tmp_path: Path) -> None:
    model = small_model(tokenizer)
    fake = fake_vllm(model, tokenizer, tmp_path)
    with BackgroundServer(fake.app()) as upstream:
        trainer = Trainer(
            model,
            tokenizer,
            algorithm=GRPO(group_size=2),
            credit=CreditConfig(mode="per_call"),
            run_dir=tmp_path,
            progress=False,
            optim={"learning_rate": 1e-2},
            rollouts={"tasks_per_step": 2, "max_tokens": 6},
            schedule={"max_steps": 2, "val_every": 0},
            engine={"backend": "vllm", "url": upstream.url, "weights_dir": tmp_path / "weights"},
        )
        result = trainer.fit(parity_agent, [{"task_id": f"t{i}", "question": f"{i}+{i}"} for i in range(8)])
    assert result.steps == 2 and result.policy_version == 2
    assert [p for p, _ in fake.requests].count("/collective_rpc") == 2
    assert "MIXED" not in fake.served_tags() and fake.overlaps() == []
    # Step 1's rollouts ran on the starting weights, step 2's on step 1's update.
    assert sorted(set(fake.served_tags())) == ["full-0", "full-1"]
    assert [r["policy_version"] for r in result.history if "train/reward" in r] == [1, 2]
    assert same_weights(fake.weights.model, model)  # the server ends on the trained weights


def test_vllm_full_weights_folder_replaces_every_shard(tokenizer: Any, tmp_path: Path) -> None:
    """vLLM loads every safetensors file in its folder: the trainer's write leaves only its own,
    with tied weights once (as `save_pretrained` writes them)."""
    from safetensors.torch import load_file

    from reinforge.stack.weight_sync.folders import write_full_weights

    model = small_model(tokenizer)
    model.save_pretrained(tmp_path)
    (tmp_path / "model-00002-of-00002.safetensors").write_bytes(b"stale")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    state = {k: v.detach() for k, v in model.state_dict().items()}
    write_full_weights(tmp_path, state, model.config)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
    ]
    written = load_file(str(tmp_path / "model.safetensors"))
    assert "lm_head.weight" not in written and model.config.tie_word_embeddings
    assert all(torch.equal(written[k], state[k]) for k in written) and len(written) == len(state) - 1
