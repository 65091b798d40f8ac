"""Property: merged trajectories and per-call transitions train the same policy gradient when the
loss treats a rollout's transitions as one sequence (seq_unit="rollout"), through the real span →
credit → advantage → logprob → loss path on a tiny Llama. With seq_unit="transition", the per-call
split changes the seq-mean objectives: the weighting the default avoids."""

from __future__ import annotations

import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from credit.span_factory import llm_span, rollout
from reinforge.algorithms import (
    GRPO,
    PolicyLossConfig,
    collate_transitions,
    compute_advantages,
    compute_token_logprobs,
    loss_scales,
    policy_loss,
)
from reinforge.credit import CreditConfig, build_transitions
from reinforge.types import Span, Transition

torch.set_num_threads(1)


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=48,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=128,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def episode_spans(
    model: LlamaForCausalLM, rollout_id: str, turns: list[tuple[list[int], list[int]]]
) -> list[Span]:
    """LLM spans for an agent whose each prompt is the previous prompt + response + tool result.

    `turns` is [(context added before the call, response)]. Behaviour logprobs are the model's own,
    nudged a little (a sampler never matches the trainer exactly) so the ratios are not all 1.
    """
    rng = random.Random(rollout_id)
    history: list[int] = []
    spans = []
    for i, (context, response) in enumerate(turns):
        prompt = history + context
        full = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=full).logits[0].float(), dim=-1)
        behaviour = [
            logp[len(prompt) + j - 1, tok].item() + rng.uniform(-0.05, 0.05) for j, tok in enumerate(response)
        ]
        behaviour = [min(b, 0.0) for b in behaviour]
        spans.append(
            llm_span(
                prompt,
                response,
                t=float(i),
                rollout_id=rollout_id,
                attempt_id=f"a-{rollout_id}",
                logprobs=behaviour,
                seq=i,
            )
        )
        history = prompt + response
    return spans


def batch_transitions(model: LlamaForCausalLM, mode: str) -> list[Transition]:
    episodes = {
        "r1": (1.0, [([1, 5, 6, 7], [10, 11, 12]), ([20, 21], [13, 14]), ([22], [15, 16, 2])]),
        "r2": (0.0, [([1, 5, 6, 7], [10, 30]), ([23, 24, 25], [31, 2])]),
        "r3": (1.0, [([1, 5, 6, 7], [10, 11, 12]), ([20, 21], [13, 14, 2])]),
    }
    transitions: list[Transition] = []
    for rollout_id, (reward, turns) in episodes.items():
        spans = episode_spans(model, rollout_id, turns)
        built, metrics = build_transitions(
            rollout(rollout_id, reward=reward, group_id="g"),
            spans,
            CreditConfig(mode=mode),  # type: ignore[arg-type]
        )
        assert metrics.merge_mismatches == 0
        transitions += built
    return transitions


def gradient(
    model: LlamaForCausalLM, transitions: list[Transition], config: PolicyLossConfig
) -> torch.Tensor:
    compute_advantages(transitions, GRPO(group_size=3, **config.model_dump(exclude={"name", "group_size"})))
    model.zero_grad()
    batch = collate_transitions(transitions, pad_token_id=0)
    out = compute_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
    scales = torch.tensor(loss_scales(transitions, config))
    loss, _ = policy_loss(
        out.logprobs, batch.behaviour_logprobs, batch.advantages, batch.response_mask, config, scales=scales
    )
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.fixture(scope="module")
def model() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"])
def test_merged_and_per_call_gradients_match_with_rollout_sequences(
    model: LlamaForCausalLM, agg: str
) -> None:
    config = GRPO(group_size=3, loss_agg=agg)  # type: ignore[arg-type]
    per_call = batch_transitions(model, "per_call")
    merged = batch_transitions(model, "merged")
    assert (len(per_call), len(merged)) == (7, 3)
    assert sum(sum(t.response_mask) for t in per_call) == sum(sum(t.response_mask) for t in merged)
    g_call, g_merged = gradient(model, per_call, config), gradient(model, merged, config)
    assert g_merged.norm() > 0
    relative = ((g_call - g_merged).norm() / g_merged.norm()).item()
    assert relative < 1e-5  # measured ≈8e-8


def test_per_transition_sequences_weigh_rollouts_by_their_number_of_calls(model: LlamaForCausalLM) -> None:
    config = GRPO(group_size=3, loss_agg="seq-mean-token-mean", seq_unit="transition")
    g_call = gradient(model, batch_transitions(model, "per_call"), config)
    g_merged = gradient(model, batch_transitions(model, "merged"), config)
    assert ((g_call - g_merged).norm() / g_merged.norm()).item() > 0.05
