"""The retrieval config on the real SmolLM2-135M-Instruct: the Agents SDK researcher's rollouts through
the gateway on the model's own ChatML template, the demonstration in the prompt, one merged sample;
and the warm start's traces (the agent recorded against `rag_smollm2_policy.py`)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from reinforge.inference import GenerationRequest
from reinforge.training.collect import trace_examples
from reinforge.training.run_config import load_callable, load_run_config, resolve_agent

from .smollm2_rollouts import SMOLLM2, record_warm_start, run_on_smollm2

CONFIG = Path(__file__).resolve().parents[2] / "examples" / "rag" / "config_smollm2.toml"


@pytest.fixture(autouse=True)
def _own_path(monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("REINFORGE_RAG_CACHE", str(tmp_path / "rag-cache"))
    monkeypatch.setattr(sys, "path", [str(CONFIG.parent), *sys.path])
    monkeypatch.setenv("REINFORGE_MODELS_DIR", str(smollm2_cache))


async def test_the_agent_runs_on_the_real_model_with_its_template(smollm2_cache: Path) -> None:
    cfg = load_run_config(CONFIG)
    from rag_data import val_tasks
    from rag_smollm2 import DEMO_QUESTION

    # The config's model is the warm start's output folder, built by `reinforge sft`: the agent and its
    # template are the same on the base the warm start trains.
    assert cfg.warm_start is not None and cfg.warm_start.base == SMOLLM2
    assert (cfg.base_dir / cfg.model.path).resolve() == cfg.warm_start.out_dir(cfg.base_dir).resolve()
    recorded = await run_on_smollm2(
        smollm2_cache, resolve_agent(cfg), val_tasks(2), cfg.credit, max_tokens=24
    )
    for rec in recorded:
        assert 0.0 <= rec.rollout.reward <= 1.0 and rec.calls >= 1
        assert rec.transitions == 1 and rec.merge_mismatches == 0  # merge rate 1.0
        prompt = rec.prompts[0]
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
        assert DEMO_QUESTION in prompt and prompt.count("<tool_call>") >= 2  # the demonstration
        assert str(rec.rollout.task["question"]) in prompt
    assert {name for rec in recorded for name in rec.agent_names} == {"researcher"}


def _plan(cfg_policy: str, base_dir: Path) -> Any:
    """The policy module's `plan` (what each conversation will do)."""
    return load_callable(cfg_policy.replace(":reply", ":plan"), base_dir, what="plan")


def test_the_policy_plans_right_and_designed_wrong_conversations() -> None:
    cfg = load_run_config(CONFIG)
    assert cfg.warm_start is not None and cfg.warm_start.policy is not None
    plan = _plan(cfg.warm_start.policy, cfg.base_dir)
    from rag_data import train_tasks

    kinds: Counter[str] = Counter()
    tasks = train_tasks(cfg.warm_start.tasks or 400)
    for task in tasks:
        chain, answer = list(task["chain"]), str(task["answer"])
        drawn = plan(str(task["question"]))
        assert drawn == plan(str(task["question"]))  # one plan per question
        if drawn.kind == "right":  # every name of the chain, in order, then the gold answer
            assert drawn.searches == chain and drawn.answer == answer
        elif drawn.kind == "trap":  # the trap, right after the first search
            assert drawn.searches == chain[:1] and drawn.answer == task["trap"] != answer
        else:  # one hop short on a 3-hop question, with a city that is not the answer
            assert task["hops"] == 3 and drawn.searches == chain[:2] and drawn.answer != answer
        kinds[drawn.kind] += 1
    # The designed mix (rag_smollm2_policy.MIX): 0.45 x (0.6 + 0.4 x 0.4) = 0.34 end right, and the
    # trap is the likelier turn after the first page.
    assert 0.26 < kinds["right"] / len(tasks) < 0.42
    assert 0.47 < kinds["trap"] / len(tasks) < 0.63 and kinds["one_short"] > 40


def test_the_policy_refuses_a_held_out_question() -> None:
    cfg = load_run_config(CONFIG)
    assert cfg.warm_start is not None and cfg.warm_start.policy is not None
    policy = load_callable(cfg.warm_start.policy, cfg.base_dir, what="policy")
    from rag_data import val_tasks

    asked = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": str(val_tasks(1)[0]["question"])},
    ]
    with pytest.raises(ValueError, match="held-out question"):
        policy(GenerationRequest(messages=asked))


def test_the_policy_answers_the_last_question_not_the_demonstration() -> None:
    cfg = load_run_config(CONFIG)
    assert cfg.warm_start is not None and cfg.warm_start.policy is not None
    policy = load_callable(cfg.warm_start.policy, cfg.base_dir, what="policy")
    plan = _plan(cfg.warm_start.policy, cfg.base_dir)
    from rag_data import train_tasks
    from rag_smollm2 import DEMO_QUESTION

    task = next(t for t in train_tasks(400) if plan(str(t["question"])).kind == "right" and t["hops"] == 3)
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": DEMO_QUESTION},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "page", "tool_call_id": "x"},
        {"role": "assistant", "content": "ANSWER: Vilkas"},
        {"role": "user", "content": str(task["question"])},
    ]
    for name in task["chain"]:
        turn = policy(GenerationRequest(messages=messages))
        assert [(c.name, c.arguments) for c in turn.tool_calls] == [("search", f'{{"query":"{name}"}}')]
        messages += [{"role": "assistant", "content": "", "tool_calls": []}, {"role": "tool", "content": "p"}]
    last = policy(GenerationRequest(messages=messages))
    assert last.text == f"ANSWER: {task['answer']}" and not last.tool_calls


async def test_warm_start_traces_are_the_agents_own_tokens_spelt_as_its_demonstration(
    smollm2_cache: Path,
) -> None:
    """`reinforge sft`'s recording step on the real tokenizer: the unchanged agent against the policy,
    each conversation one merged sequence, the trained replies spelt as the prompt's demonstration and
    within the config's `max_tokens`."""
    cfg = load_run_config(CONFIG)
    ws = cfg.warm_start
    assert ws is not None and ws.policy is not None and not ws.compact_json
    assert ws.max_tokens <= cfg.trainer.rollouts.max_tokens
    from rag_data import answer_f1, train_tasks
    from rag_smollm2 import DEMO_QUESTION

    plan = _plan(ws.policy, cfg.base_dir)
    tasks = train_tasks(12)
    recorded = await record_warm_start(cfg, smollm2_cache, tasks)
    store, tokenizer = recorded.store, recorded.tokenizer
    rewards = recorded.rewards
    for task in tasks:  # the agent's reward is the plan's answer F1 (every plan searches)
        drawn = plan(str(task["question"]))
        assert rewards[str(task["question"])] == pytest.approx(answer_f1(drawn.answer, str(task["answer"])))
    assert 0.0 < recorded.mean_reward < 1.0  # the mix: some right, some wrong

    examples = await trace_examples(store)
    assert len(examples) == len(tasks)  # each conversation's calls merge into one sequence
    for example in examples:
        prompt = tokenizer.decode(example.input_ids[: example.loss_mask.index(1)])
        trained = tokenizer.decode(
            [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
        )
        assert DEMO_QUESTION in prompt  # the demonstration is context, never trained
        demo_call = '<tool_call>{"name": "search", "arguments": {"query":"Morter Chronicle"}}</tool_call>'
        assert demo_call in prompt
        # The policy's calls are spelt as the demonstration spells its own, token for token.
        assert trained.startswith('<tool_call>{"name": "search", "arguments": {"query":"'), trained
        assert "ANSWER: " in trained and trained.endswith("<|im_end|>")
