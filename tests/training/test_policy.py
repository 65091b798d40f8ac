"""The policy update on a real tiny Llama: it moves the right way, micro-batching doesn't change it,
LoRA trains adapters only, PPO trains its value head."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from reinforge.algorithms import (
    GRPO,
    PPO,
    collate_transitions,
    compute_token_logprobs,
    loss_scales,
    policy_loss,
)
from reinforge.errors import InvalidRequestError
from reinforge.training.config import LoraSettings, OptimSettings
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
    policy = Policy(
        model, GRPO(group_size=8), OptimSettings(learning_rate=1e-2), pad_token_id=tokenizer.pad_token_id
    )
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
            OptimSettings(learning_rate=1e-3, micro_batch_tokens=budget),
            pad_token_id=0,
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
        OptimSettings(
            learning_rate=5e-2, lora=LoraSettings(r=4, alpha=8, target_modules=["q_proj", "v_proj"])
        ),
        pad_token_id=0,
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
            OptimSettings(learning_rate=1e-3, lora=LoraSettings(target_modules=["nope"])),
            pad_token_id=0,
        )


def test_kl_to_the_reference_is_reported(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    policy = Policy(model, GRPO(group_size=8, kl_coef=0.1), OptimSettings(learning_rate=1e-2), pad_token_id=0)
    first = policy.update(batch)
    second = policy.update(batch)
    assert first["kl/ref"] == pytest.approx(0.0, abs=1e-6)
    assert second["kl/ref"] > 0


def test_ppo_trains_its_value_head(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    batch = transitions(model, tokenizer.pad_token_id)
    policy = Policy(model, PPO(), OptimSettings(learning_rate=1e-2), pad_token_id=0)
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
    policy = Policy(model, GRPO(), OptimSettings(learning_rate=1e-3), pad_token_id=0)
    with pytest.raises(InvalidRequestError):
        policy.update(batch)


def flat_group(model: Any, pad: int, n: int = 8) -> list[Transition]:
    """A group whose rewards are all equal: zero advantages, so zero loss and zero gradient."""
    return [
        t.model_copy(update={"rollout_id": f"f{i}", "group_id": "flat", "reward": 1.0, "advantage": 0.0})
        for i, t in enumerate(transitions(model, pad, n=n, seed=7))
    ]


def test_rows_without_signal_skip_the_forward_and_leave_the_gradient(tokenizer: Any) -> None:
    model = small_model(tokenizer)
    algo = GRPO(group_size=8)
    batch = transitions(model, tokenizer.pad_token_id) + flat_group(model, tokenizer.pad_token_id)
    policy = Policy(
        copy.deepcopy(model), algo, OptimSettings(learning_rate=1e-3, max_grad_norm=None), pad_token_id=0
    )
    metrics = policy.update(batch)
    assert metrics["update/rows_without_signal"] == 8
    assert metrics["tokens"] == sum(len(t.response_ids) for t in batch)
    got = torch.cat([p.grad.flatten() for p in policy.model.parameters() if p.grad is not None])

    # By hand: every row through the ordinary forward, scales over the whole batch.
    reference = copy.deepcopy(model).train()
    rows = collate_transitions(batch, 0)
    lp = compute_token_logprobs(
        reference, rows.input_ids, rows.attention_mask, rows.response_mask, with_entropy=True
    ).logprobs
    loss, _ = policy_loss(
        lp,
        rows.behaviour_logprobs,
        rows.advantages,
        rows.response_mask,
        algo,
        old_logprobs=lp.detach(),
        scales=torch.tensor(loss_scales(batch, algo)),
    )
    loss.backward()
    want = torch.cat([p.grad.flatten() for p in reference.parameters() if p.grad is not None])
    assert float((got - want).norm() / want.norm()) < 1e-5


def test_an_all_flat_batch_still_takes_the_optimiser_step(tokenizer: Any) -> None:
    """AdamW moves the weights on a zero gradient once it has momentum: skipping every row must not
    skip that step."""
    model = small_model(tokenizer)
    pad = tokenizer.pad_token_id
    signal, flat = transitions(model, pad), flat_group(model, pad)
    policy = Policy(
        copy.deepcopy(model), GRPO(group_size=8), OptimSettings(learning_rate=1e-2), pad_token_id=0
    )
    by_hand = Policy(
        copy.deepcopy(model), GRPO(group_size=8), OptimSettings(learning_rate=1e-2), pad_token_id=0
    )
    policy.update(signal)
    by_hand.update(signal)
    after_signal = [p.detach().clone() for p in policy.model.parameters()]
    metrics = policy.update(flat)
    assert metrics["update/rows_without_signal"] == 8 and metrics["update/grad_norm"] == 0.0
    for p in by_hand.model.parameters():
        p.grad = torch.zeros_like(p)
    by_hand.optimizer.step()
    for a, b in zip(policy.model.parameters(), by_hand.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, b) for a, b in zip(policy.model.parameters(), after_signal, strict=True))


def test_the_optimiser_is_fused_and_steps_as_plain_adamw(tokenizer: Any) -> None:
    """AdamW's fused kernel (one call for every parameter) moves the weights as plain AdamW does on
    the same gradients, and stays fused after loading a checkpoint written by an unfused optimiser."""
    model = small_model(tokenizer)
    fused = Policy(
        copy.deepcopy(model), GRPO(group_size=8), OptimSettings(learning_rate=1e-2), pad_token_id=0
    )
    plain = Policy(
        copy.deepcopy(model), GRPO(group_size=8), OptimSettings(learning_rate=1e-2), pad_token_id=0
    )
    plain.optimizer = torch.optim.AdamW(plain.model.parameters(), lr=1e-2, weight_decay=0.0)
    assert fused.optimizer.param_groups[0]["fused"] is True
    assert plain.optimizer.param_groups[0]["fused"] is None
    gen = torch.Generator().manual_seed(0)

    def step_both(a: Policy, b: Policy) -> None:
        """One step of each on the same gradient (recomputing it would differ in the last bits,
        which Adam's normalisation blows up where a gradient is near zero)."""
        for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
            pa.grad = torch.randn(pa.shape, generator=gen) * 1e-2
            pb.grad = pa.grad.clone()
        a.optimizer.step()
        b.optimizer.step()
        for pa, pb in zip(a.model.parameters(), b.model.parameters(), strict=True):
            assert torch.allclose(pa, pb, atol=1e-6, rtol=1e-5)

    for _ in range(3):
        step_both(fused, plain)
    moved = zip(fused.model.parameters(), model.parameters(), strict=True)
    assert any(not torch.equal(a, b) for a, b in moved)
    resumed = Policy(
        copy.deepcopy(model), GRPO(group_size=8), OptimSettings(learning_rate=1e-2), pad_token_id=0
    )
    resumed.load_state_dict(copy.deepcopy(plain.state_dict()))  # as from disk: no shared tensors
    assert resumed.optimizer.param_groups[0]["fused"] is True
    step_both(resumed, plain)
    metrics = resumed.update(transitions(model, tokenizer.pad_token_id))
    assert metrics["update/grad_norm"] > 0
