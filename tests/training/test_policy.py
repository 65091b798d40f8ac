"""The policy update on a real tiny Llama: it moves the right way, micro-batching doesn't change it,
LoRA trains adapters only, PPO trains its value head."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from reinforge.algorithms import GRPO, PPO, compute_token_logprobs
from reinforge.errors import InvalidRequestError
from reinforge.training.config import LoraSettings
from reinforge.training.policy import Policy
from reinforge.types import Transition

from .conftest import small_model


def transitions(model: Any, pad: int, n: int = 8, seed: int = 0) -> list[Transition]:
    """Rollouts of one group, half rewarded: behaviour logprobs are the model's own (on-policy)."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        prompt = torch.randint(
            10, 200, (int(torch.randint(4, 12, (1,), generator=gen)),), generator=gen
        ).tolist()
        response = torch.randint(
            10, 200, (int(torch.randint(2, 8, (1,), generator=gen)),), generator=gen
        ).tolist()
        ids = torch.tensor([prompt + response])
        mask = torch.tensor([[0.0] * len(prompt) + [1.0] * len(response)])
        with torch.no_grad():
            lp = compute_token_logprobs(model, ids, torch.ones_like(ids), mask).logprobs[0, len(prompt) :]
        out.append(
            Transition(
                rollout_id=f"r{i}",
                attempt_id=f"a{i}",
                group_id="g",
                prompt_ids=prompt,
                response_ids=response,
                response_mask=[1] * len(response),
                behaviour_logprobs=lp.tolist(),
                reward=float(i % 2),
                advantage=1.0 if i % 2 else -1.0,
            )
        )
    return out


def seq_logprob(model: Any, t: Transition) -> float:
    ids = torch.tensor([t.prompt_ids + t.response_ids])
    mask = torch.tensor([[0.0] * len(t.prompt_ids) + [1.0] * len(t.response_ids)])
    with torch.no_grad():
        return float(compute_token_logprobs(model, ids, torch.ones_like(ids), mask).logprobs.sum())


def test_update_raises_rewarded_and_lowers_unrewarded_responses(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    before = [seq_logprob(model, t) for t in batch]
    policy = Policy(model, GRPO(group_size=8), pad_token_id=tokenizer.pad_token_id, learning_rate=1e-2)
    metrics = policy.update(batch)
    after = [seq_logprob(policy.model, t) for t in batch]
    up = [a - b for a, b, t in zip(after, before, batch, strict=True) if t.advantage > 0]  # type: ignore[operator]
    down = [a - b for a, b, t in zip(after, before, batch, strict=True) if t.advantage < 0]  # type: ignore[operator]
    assert sum(up) > 0 > sum(down)
    assert metrics["tokens"] == sum(len(t.response_ids) for t in batch)
    assert metrics["update/grad_norm"] > 0
    assert abs(metrics["policy/ratio_mean"] - 1.0) < 1e-4  # on-policy: π_old is the behaviour policy


def test_micro_batching_gives_the_same_gradient(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id, n=12)
    grads, counts = [], []
    for budget in (100_000, 64):
        policy = Policy(
            copy.deepcopy(model),
            GRPO(group_size=12),
            pad_token_id=0,
            learning_rate=1e-3,
            micro_batch_tokens=budget,
        )
        counts.append(policy.update(batch)["update/micro_batches"])
        # update() leaves the accumulated gradient of its last epoch on the parameters.
        grads.append(torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None]))
    assert counts[0] == 1 and counts[1] > 1
    assert torch.allclose(grads[0], grads[1], atol=1e-6, rtol=1e-4)


def test_lora_trains_adapters_and_publishes_merged_base_weights(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    base_state = {k: v.clone() for k, v in model.state_dict().items()}
    batch = transitions(model, tokenizer.pad_token_id)
    policy = Policy(
        model,
        GRPO(group_size=8),
        pad_token_id=0,
        learning_rate=5e-2,
        lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"]),
    )
    trainable = [n for n, p in policy.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    policy.update(batch)
    policy.update(batch)
    state = policy.engine_state()
    assert set(state) == set(base_state)
    changed = [k for k in state if not torch.equal(state[k], base_state[k])]
    assert changed and all("q_proj" in k or "v_proj" in k for k in changed)
    with pytest.raises(InvalidRequestError, match="not in the model"):
        Policy(
            small_model(tokenizer),
            GRPO(),
            pad_token_id=0,
            learning_rate=1e-3,
            lora=LoraSettings(target_modules=["nope"]),
        )


def test_kl_to_the_reference_is_reported(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    policy = Policy(model, GRPO(group_size=8, kl_coef=0.1), pad_token_id=0, learning_rate=1e-2)
    first = policy.update(batch)
    second = policy.update(batch)
    assert first["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl/ref"] > 0


def test_ppo_trains_its_value_head(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    policy = Policy(model, PPO(), pad_token_id=0, learning_rate=1e-2)
    values = policy.values(batch)
    assert values == [0.0] * len(batch)  # the head starts at zero
    returns = [t.reward for t in batch]
    metrics = policy.update(batch, returns)
    assert metrics["value/loss"] > 0
    assert policy.values(batch) != values
    with pytest.raises(InvalidRequestError):
        policy.update(batch)  # PPO without value targets


def test_update_refuses_transitions_without_advantages(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    batch[0].advantage = None
    policy = Policy(model, GRPO(), pad_token_id=0, learning_rate=1e-3)
    with pytest.raises(InvalidRequestError):
        policy.update(batch)
