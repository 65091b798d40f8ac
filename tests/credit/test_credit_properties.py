"""Properties of merging that must hold for any episode that extends its history exactly."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from credit.span_factory import llm_span, rollout
from reinforge.credit import CreditConfig, build_transitions

tokens = st.lists(st.integers(min_value=3, max_value=500), min_size=1, max_size=6)
turns = st.lists(st.tuples(st.lists(st.integers(3, 500), max_size=4), tokens), min_size=1, max_size=5)


@settings(max_examples=60, deadline=None)
@given(first_prompt=tokens, turns=turns)
def test_merged_sample_is_the_final_sequence_with_only_model_tokens_trained(
    first_prompt: list[int], turns: list[tuple[list[int], list[int]]]
) -> None:
    spans, history = [], list(first_prompt)
    for i, (observation, response) in enumerate(turns):
        prompt = history + (observation if i else [])
        spans.append(llm_span(prompt, response, t=float(i), seq=i, logprobs=[-1.0 - i] * len(response)))
        history = prompt + response
    per_call, _ = build_transitions(rollout(), spans, CreditConfig())
    (merged,), metrics = build_transitions(rollout(), spans, CreditConfig(mode="merged"))

    assert merged.prompt_ids + merged.response_ids == history
    trained = [tok for tok, m in zip(merged.response_ids, merged.response_mask, strict=True) if m]
    assert trained == [tok for t in per_call for tok in t.response_ids]
    trained_logprobs = [
        lp for lp, m in zip(merged.behaviour_logprobs, merged.response_mask, strict=True) if m
    ]
    assert trained_logprobs == [lp for t in per_call for lp in t.behaviour_logprobs]
    assert all(
        lp == 0.0 for lp, m in zip(merged.behaviour_logprobs, merged.response_mask, strict=True) if not m
    )
    assert merged.num_calls == len(turns) == metrics.merged_calls + 1
    assert metrics.trained_tokens == sum(len(r) for _, r in turns)
