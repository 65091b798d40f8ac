"""The Calc-X config on the real SmolLM2-135M-Instruct: the AutoGen agent's rollouts through the gateway
on the model's own ChatML template, the demonstrations in the prompt, each episode one merged sample;
and the warm start's traces (the agent recorded against `calc_x_smollm2_policy.py`)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest

from reinforge.demo.tasks import is_held_out, train_tasks, val_tasks
from reinforge.inference import GenerationRequest
from reinforge.training.collect import trace_examples
from reinforge.training.run_config import load_callable, load_run_config, resolve_agent

from .smollm2_rollouts import SMOLLM2, record_warm_start, run_on_smollm2

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "calc_x" / "config_smollm2.toml"


@pytest.fixture(autouse=True)
def _own_path(monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path) -> None:
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("REINFORGE_MODELS_DIR", str(smollm2_cache))


async def test_the_agent_runs_on_the_real_model_with_its_template(smollm2_cache: Path) -> None:
    cfg = load_run_config(CONFIG)
    assert cfg.warm_start is not None and cfg.warm_start.base == SMOLLM2
    recorded = await run_on_smollm2(
        smollm2_cache, resolve_agent(cfg), val_tasks(2), cfg.credit, max_tokens=24
    )
    for rec in recorded:
        assert rec.rollout.reward in (0.0, 1.0) and rec.calls >= 1
        assert rec.transitions == 1 and rec.merge_mismatches == 0  # merge rate 1.0
        prompt = rec.prompts[0]
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
        assert "What is 25+13*4?" in prompt and prompt.count("<tool_call>") >= 4  # two demonstrations
        assert f"What is {rec.rollout.task['question']}?" in prompt
    assert {name for rec in recorded for name in rec.agent_names} == {"calc_x"}


def test_the_policy_plans_right_and_designed_wrong_conversations() -> None:
    cfg = load_run_config(CONFIG)
    assert cfg.warm_start is not None and cfg.warm_start.policy is not None
    plan = load_callable(cfg.warm_start.policy.replace(":reply", ":plan"), cfg.base_dir, what="plan")
    # Right: the product first, then both calls, then the answer.
    assert plan("What is 3+4*5?") in (
        [(4, "*", 5), (3, "+", 20), 23],
        [(3, "+", 4), (7, "*", 5), 35],  # left to right: wrong
        [(4, "*", 5), 20],  # answered after the first result: wrong
        [(3, "+", 4), 7],
    )
    assert plan("What is 3+4*5?") == plan("3+4*5")  # one plan per question, however it is asked
    kinds: Counter[str] = Counter()
    for task in train_tasks(400):
        turns = plan(str(task["question"]))
        right = turns[-1] == task["answer"]
        if turns[:-1] == [tuple(s) for s in task["steps"]]:
            assert right  # the right two calls end on the answer
        kinds["right" if right else "early" if len(turns) == 2 else "left_to_right"] += 1
    # The designed mix (calc_x_smollm2_policy.MIX): about 0.7 * (0.5 + 0.5 * 0.4) = 0.49 right.
    assert 0.38 < kinds["right"] / 400 < 0.60 and kinds["early"] > 60 and kinds["left_to_right"] > 30


async def test_warm_start_traces_are_the_agents_own_tokens_spelt_as_its_demonstrations(
    smollm2_cache: Path,
) -> None:
    """`reinforge sft`'s recording step on the real tokenizer: the unchanged agent against the policy,
    each conversation one merged sequence, the trained replies spelt as the prompt's demonstrations."""
    cfg = load_run_config(CONFIG)
    ws = cfg.warm_start
    assert ws is not None and ws.policy is not None and not ws.compact_json
    plan = load_callable(ws.policy.replace(":reply", ":plan"), cfg.base_dir, what="plan")
    tasks = train_tasks(12)
    recorded = await record_warm_start(cfg, smollm2_cache, tasks)
    store, tokenizer = recorded.store, recorded.tokenizer
    rewards = recorded.rewards
    for task in tasks:  # the agent's reward is the plan's: 1 exactly when the plan ends on the answer
        assert not is_held_out(str(task["question"]))
        assert rewards[str(task["question"])] == float(plan(str(task["question"]))[-1] == task["answer"])
    assert 0.0 < recorded.mean_reward < 1.0  # the mix: some right, some wrong

    examples = await trace_examples(store)
    assert len(examples) == len(tasks)  # each conversation's calls merge into one sequence
    for example in examples:
        prompt = tokenizer.decode(example.input_ids[: example.loss_mask.index(1)])
        trained = tokenizer.decode(
            [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
        )
        assert "What is 25+13*4?" in prompt  # the demonstrations are context, never trained
        demo_call = '<tool_call>{"name": "calculator", "arguments": {"a":13,"op":"*","b":4}}</tool_call>'
        assert demo_call in prompt
        # The policy's calls are spelt as the demonstrations spell theirs, token for token.
        assert trained.startswith('<tool_call>{"name": "calculator", "arguments": {"a":'), trained
        assert "ANSWER: " in trained and trained.endswith("<|im_end|>")


def test_the_policy_answers_the_last_question_not_a_demonstration() -> None:
    cfg = load_run_config(CONFIG)
    assert cfg.warm_start is not None and cfg.warm_start.policy is not None
    policy = load_callable(cfg.warm_start.policy, cfg.base_dir, what="policy")
    demo = [
        {"role": "user", "content": "What is 25+13*4?"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "52", "tool_call_id": "x"},
    ]
    asked = [{"role": "system", "content": "s"}, *demo, {"role": "user", "content": "What is 2*3+4?"}]
    first = policy(GenerationRequest(messages=asked))
    assert [(c.name, c.arguments) for c in first.tool_calls] == [("calculator", '{"a":2,"op":"*","b":3}')]
    after_one = [
        *asked,
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "6"},
    ]
    second = policy(GenerationRequest(messages=after_one))
    plan = load_callable(cfg.warm_start.policy.replace(":reply", ":plan"), cfg.base_dir, what="plan")
    if len(plan("2*3+4")) == 2:  # this question's plan answers after the first result
        assert second.text == "ANSWER: 6" and not second.tool_calls
    else:
        assert [c.arguments for c in second.tool_calls] == ['{"a":6,"op":"+","b":4}']
