"""Shared-prompt logprobs equal the ordinary forward's, values and gradients, on a real tiny Llama."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from reinforge.algorithms import collate_transitions, compute_token_logprobs
from reinforge.algorithms.shared_prefix import prompt_groups, shared_prefix_logprobs
from reinforge.types import Transition

torch.set_num_threads(1)


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.3)  # varied logits, so a wrong position would show
    return model


def groups(prompts: int, per_prompt: int, seed: int = 0) -> list[Transition]:
    """`per_prompt` rows for each of `prompts` prompts of different lengths; masks with holes."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for g in range(prompts):
        prompt = torch.randint(3, 64, (4 + 3 * g,), generator=gen).tolist()
        for k in range(per_prompt):
            n = 1 + (g + 2 * k) % 9
            response = torch.randint(3, 64, (n,), generator=gen).tolist()
            mask = [0 if (k + i) % 4 == 3 else 1 for i in range(n)]
            out.append(
                Transition(
                    rollout_id=f"r{g}-{k}",
                    attempt_id=f"a{g}-{k}",
                    group_id=f"g{g}",
                    prompt_ids=prompt,
                    response_ids=response,
                    response_mask=mask,
                    behaviour_logprobs=[0.0] * n,
                )
            )
    return out


def test_prompt_groups_index_rows_by_their_prompt() -> None:
    batch = collate_transitions(groups(3, 4), pad_token_id=0)
    prompts, rows = prompt_groups(batch)
    assert [len(p) for p in prompts] == [4, 7, 10]
    assert rows == [0] * 4 + [1] * 4 + [2] * 4


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_shared_prompts_give_the_same_logprobs_entropy_and_gradient(temperature: float) -> None:
    model = tiny_llama()
    twin = copy.deepcopy(model)
    batch = collate_transitions(groups(3, 6), pad_token_id=0)
    weights = torch.randn(batch.input_ids.shape, generator=torch.Generator().manual_seed(1))

    plain = compute_token_logprobs(
        model,
        batch.input_ids,
        batch.attention_mask,
        batch.response_mask,
        temperature=temperature,
        with_entropy=True,
    )
    shared = shared_prefix_logprobs(twin, batch, temperature=temperature, with_entropy=True)
    assert shared is not None and shared.entropy is not None and plain.entropy is not None
    assert torch.equal(shared.logprobs != 0, plain.logprobs != 0)
    assert int((plain.logprobs != 0).sum()) == int(batch.response_mask.sum())
    assert torch.allclose(shared.logprobs, plain.logprobs, atol=1e-5)
    assert torch.allclose(shared.entropy, plain.entropy, atol=1e-5)

    (plain.logprobs * weights).sum().backward()
    (shared.logprobs * weights).sum().backward()
    for (name, a), b in zip(model.named_parameters(), twin.parameters(), strict=True):
        assert a.grad is not None and b.grad is not None, name
        # Same function, different float summation order: compare relative to the gradient's size.
        assert float((a.grad - b.grad).norm() / a.grad.norm()) < 1e-5, name


def test_distinct_prompts_fall_back_to_the_ordinary_forward() -> None:
    batch = collate_transitions(groups(6, 1), pad_token_id=0)
    assert shared_prefix_logprobs(tiny_llama(), batch) is None
