"""`[trainer.compute]` (device and dtype) resolved on a CPU machine, a bfloat16-autocast update and
fit, and model hub ids passed to `from_pretrained` as ids, not as paths."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import huggingface_hub.constants
import pytest
import torch
import transformers
from pydantic import ValidationError

from reinforge.algorithms import GRPO
from reinforge.errors import InvalidRequestError
from reinforge.training import trainer as trainer_module
from reinforge.training.config import ComputeSettings, OptimSettings, TrainerConfig
from reinforge.training.device import Placement, resolve_placement
from reinforge.training.policy import Policy
from reinforge.training.run_config import load_model, load_run_config
from reinforge.training.trainer import Trainer

from .conftest import parity_agent, small_model
from .test_policy import seq_logprob, transitions
from .test_train_cli import write_run

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: auto means CUDA here")


@no_cuda
def test_device_settings_auto_means_cpu_and_float32_without_a_gpu() -> None:
    placement = resolve_placement(ComputeSettings())
    assert placement == Placement(torch.device("cpu"), None)
    assert placement.engine_dtype is torch.float32
    bf16 = resolve_placement(ComputeSettings(device="cpu", dtype="bfloat16"))
    assert bf16.autocast is torch.bfloat16 and bf16.engine_dtype is torch.bfloat16
    for device in ("cuda", "cuda:0"):
        with pytest.raises(InvalidRequestError, match=r"sees no CUDA GPU.*device = 'cpu'"):
            resolve_placement(ComputeSettings(device=device))


def test_device_settings_refuse_what_they_cannot_mean() -> None:
    for device in ("gpu", "cuda:x", "CUDA", "mps"):
        with pytest.raises(ValidationError, match="device"):
            TrainerConfig.model_validate({"compute": {"device": device}})
    with pytest.raises(ValidationError, match="dtype"):
        TrainerConfig.model_validate({"compute": {"dtype": "float16"}})
    config = TrainerConfig.model_validate({"compute": {"device": "cuda:1", "dtype": "bfloat16"}})
    assert (config.compute.device, config.compute.dtype) == ("cuda:1", "bfloat16")


def test_device_settings_bfloat16_update_autocasts_over_float32_weights(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    before = [seq_logprob(model, t) for t in batch]
    policy = Policy(
        model,
        GRPO(group_size=8),
        OptimSettings(learning_rate=1e-2),
        pad_token_id=tokenizer.pad_token_id,
        placement=Placement(torch.device("cpu"), torch.bfloat16),
    )
    metrics = policy.update(batch)
    assert all(p.dtype is torch.float32 for p in policy.model.parameters())  # master weights stay fp32
    assert all(p.grad is None or p.grad.dtype is torch.float32 for p in policy.model.parameters())
    after = [seq_logprob(policy.model, t) for t in batch]
    rewarded = sum(a - b for a, b, t in zip(after, before, batch, strict=True) if (t.advantage or 0) > 0)
    unrewarded = sum(a - b for a, b, t in zip(after, before, batch, strict=True) if (t.advantage or 0) < 0)
    assert rewarded > 0 > unrewarded
    # bf16 logits: π_old (bf16) against the fp32 behaviour logprobs drifts a little, not a lot.
    assert 0 < metrics["policy/behaviour_drift"] < 0.1


def test_device_settings_a_bfloat16_fit_serves_a_bf16_engine_copy(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    served: list[torch.dtype] = []

    class WatchedStack(trainer_module.RolloutStack):
        def __init__(self, store: Any, model: Any, *args: Any, **kwargs: Any) -> None:
            served.append(next(model.parameters()).dtype)
            super().__init__(store, model, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "RolloutStack", WatchedStack)
    trainer = Trainer(
        small_model(tokenizer),
        tokenizer,
        run_dir=tmp_path,
        progress=False,
        compute={"device": "cpu", "dtype": "bfloat16"},
        rollouts={"tasks_per_step": 2, "max_tokens": 4},
        engine={"max_batch_size": 8, "max_seq_len": 128},
        schedule={"max_steps": 1, "val_every": 0},
        algorithm=GRPO(group_size=2),
    )
    result = trainer.fit(parity_agent, [{"question": f"{i}+1"} for i in range(4)])
    assert result.steps == 1 and result.policy_version == 1
    assert served == [torch.bfloat16]  # the engine's copy; the trained weights stay float32
    assert all(p.dtype is torch.float32 for p in trainer.model.parameters())
    step = next(r for r in result.history if "train/reward" in r)
    assert step["update/transitions"] == 4
    assert step["update/grad_norm"] >= 0.0


def test_a_hub_id_in_a_config_reaches_from_pretrained_as_an_id(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = write_run(tmp_path, tokenizer)
    config.write_text(config.read_text().replace('path = "model"', 'path = "some-org/calc-policy"'))
    model, loaded_tokenizer = load_model(load_run_config(config))
    assert model == "some-org/calc-policy" and loaded_tokenizer is None  # no folder of that name here

    asked: list[str] = []
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(name: str, *args: Any, **kwargs: Any) -> Any:
        asked.append(name)
        return original(name, *args, **kwargs)

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)  # no network here anyway
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    with pytest.raises(InvalidRequestError, match="cannot load the model 'some-org/calc-policy'") as caught:
        Trainer(model)
    assert asked == ["some-org/calc-policy"]  # the id itself, not <config folder>/some-org/calc-policy
    assert str(tmp_path) not in str(caught.value)
    assert isinstance(caught.value.__cause__, OSError)  # the hub's own error, kept


def test_a_model_name_that_is_neither_folder_nor_loader_nor_hub_id_is_a_clear_error(
    tokenizer: Any, tmp_path: Path
) -> None:
    config = write_run(tmp_path, tokenizer)
    config.write_text(config.read_text().replace('path = "model"', 'path = "no_such_model"'))
    with pytest.raises(InvalidRequestError, match=r"no folder .*no_such_model.*hub id"):
        load_model(load_run_config(config))
    (tmp_path / "org" / "name").mkdir(parents=True)  # a folder wins over the hub id it looks like
    config.write_text(config.read_text().replace('path = "no_such_model"', 'path = "org/name"'))
    assert load_model(load_run_config(config))[0] == tmp_path / "org" / "name"
