"""LoRA's memory savings leave the maths alone: a bf16 frozen base under bf16 autocast gives the same
logprobs and adapter gradients as the float32 base, and the merge without a model copy gives the
same weights as peft's `merge_and_unload`."""

from __future__ import annotations

import copy
from typing import Any

import torch

from reinforge.algorithms import GRPO, collate_transitions
from reinforge.training.config import LoraSettings, OptimSettings
from reinforge.training.device import Placement
from reinforge.training.policy import Policy, merged_lora_state

from .conftest import small_model
from .test_policy import transitions

BF16 = Placement(torch.device("cpu"), torch.bfloat16)


def lora_policy(model: Any, base_dtype: str, placement: Placement = BF16) -> Policy:
    lora = LoraSettings.model_validate({"r": 4, "alpha": 8, "base_dtype": base_dtype})
    torch.manual_seed(0)  # peft draws lora_A at random: both policies start alike
    return Policy(
        copy.deepcopy(model),
        GRPO(group_size=8),
        OptimSettings(learning_rate=1e-2, lora=lora),
        pad_token_id=0,
        placement=placement,
    )


def test_a_bf16_base_gives_the_same_logprobs_and_gradients_under_autocast(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    policies = [lora_policy(model, "float32"), lora_policy(model, "compute")]
    dtypes = {p.dtype for n, p in policies[1].model.named_parameters() if ".base_layer." in n}
    assert dtypes == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in policies[1].model.parameters() if p.requires_grad)
    grads, logprobs = [], []
    for policy in policies:
        for p in policy.model.parameters():
            p.grad = None
        lp = policy._logprobs(policy.model, collate_transitions(batch, 0)).logprobs
        logprobs.append(lp.detach())
        lp.sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert torch.allclose(logprobs[0], logprobs[1], atol=1e-6, rtol=0)
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-5)
    # One update each moves the adapters alike.
    metrics = [policy.update(batch) for policy in policies]
    assert abs(metrics[0]["loss/total"] - metrics[1]["loss/total"]) < 1e-6
    after = [
        torch.cat([p.detach().flatten() for p in pol.model.parameters() if p.requires_grad])
        for pol in policies
    ]
    assert torch.allclose(after[0], after[1], atol=1e-6)
    # The engine gets the merged weights in the base's dtype, rounded once from base + delta.
    state = policies[1].engine_state()
    assert state["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    reference = policies[0].engine_state()
    for key, value in reference.items():
        assert torch.allclose(state[key].float(), value.float(), atol=1e-2), key


def test_the_merge_without_a_copy_equals_peft_merge_and_unload(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    policy = lora_policy(model, "float32", placement=Placement(torch.device("cpu")))
    policy.update(batch)  # adapters away from their zero start
    merged = copy.deepcopy(policy.model).merge_and_unload()  # type: ignore[operator]
    expected = merged.state_dict()
    state = merged_lora_state(policy.model)
    assert state is not None and set(state) == set(expected)
    changed = 0
    for key, value in expected.items():
        assert state[key].dtype == value.dtype
        assert torch.equal(state[key], value), key
        changed += not torch.equal(value, model.state_dict()[key])
    assert changed > 0
    # Nothing in the policy moved: the merge wrote new tensors.
    assert torch.equal(
        policy.engine_state()["model.layers.0.self_attn.q_proj.weight"],
        state["model.layers.0.self_attn.q_proj.weight"],
    )
    for name, p in policy.model.named_parameters():
        if ".base_layer." in name:
            assert torch.equal(
                p, model.state_dict()[name.replace("base_model.model.", "").replace(".base_layer", "")]
            )
