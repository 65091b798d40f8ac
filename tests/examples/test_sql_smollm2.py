"""The Text-to-SQL configs on the real SmolLM2-135M-Instruct: the LangGraph graph's writer, checker and
rewriter calls through the gateway on the model's own ChatML template, with per-role adapters a
training step that leaves the checker frozen (it has no adapter, and the shared base does not move),
and the warm start's traces (the agent recorded against `sql_smollm2_policy.py`)."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reinforge.inference import GenerationRequest
from reinforge.training.collect import trace_examples
from reinforge.training.run_config import load_dataset, load_run_config, resolve_agent
from reinforge.training.trainer import Trainer

from .smollm2_rollouts import SMOLLM2, record_warm_start, run_on_smollm2

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sql"


@pytest.fixture(autouse=True)
def _own_path(monkeypatch: pytest.MonkeyPatch, smollm2_cache: Path, tmp_path: Path) -> None:
    monkeypatch.setenv("REINFORGE_SQL_CACHE", str(tmp_path / "sql-cache"))
    monkeypatch.setattr(sys, "path", [str(EXAMPLE), *sys.path])
    monkeypatch.setenv("REINFORGE_MODELS_DIR", str(smollm2_cache))


async def test_the_graph_runs_on_the_real_model_with_its_template(smollm2_cache: Path) -> None:
    from sql_data import val_tasks

    cfg = load_run_config(EXAMPLE / "config_smollm2.toml")
    assert cfg.credit.agents == ["writer", "rewriter"]
    # The config's model is the warm start's output folder, built by `reinforge sft`: the graph and its
    # template are the same on the base the warm start trains, which this test runs.
    assert cfg.warm_start is not None and cfg.warm_start.base == SMOLLM2
    assert (cfg.base_dir / cfg.model.path).resolve() == cfg.warm_start.out_dir(cfg.base_dir).resolve()
    recorded = await run_on_smollm2(
        smollm2_cache, resolve_agent(cfg), val_tasks(1), cfg.credit, max_tokens=16
    )
    rec = recorded[0]
    assert rec.rollout.reward in (0.0, 1.0)
    assert rec.agent_names[:2] == ["writer", "checker"]
    assert set(rec.agent_names) <= {"writer", "checker", "rewriter"}
    # Per call: the checker's calls are recorded but not trained; nothing to merge, nothing unmatched.
    assert rec.transitions == sum(name != "checker" for name in rec.agent_names)
    assert rec.merge_mismatches == 0
    for prompt in rec.prompts:
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
    assert "Reply with the query only." in rec.prompts[0] and "Reply OK if" in rec.prompts[1]


def test_a_training_step_leaves_the_checker_frozen(smollm2_cache: Path, tmp_path: Path) -> None:
    cfg = load_run_config(
        EXAMPLE / "config_smollm2_lora.toml",
        {
            "run_dir": tmp_path / "run",
            "progress": False,
            "schedule": {"max_steps": 1, "max_minutes": None, "val_greedy": False},
            "rollouts": {"tasks_per_step": 1, "max_tokens": 12},
            "runners": {"processes": 0, "concurrency": 8},
            "checkpoints": {"every": 0},
        },
    )
    assert cfg.trainer.optim.lora is not None and cfg.trainer.optim.lora.roles == ["writer", "rewriter"]
    algorithm = cfg.algorithm_config().model_copy(update={"group_size": 2})
    trainer = Trainer(SMOLLM2, algorithm=algorithm, credit=cfg.credit, config=cfg.trainer)

    fit = trainer.fit(resolve_agent(cfg), load_dataset(cfg.data.train, cfg.base_dir)[:4], [])
    assert fit.steps == 1
    params = dict(trainer.model.named_parameters())
    adapters = {n for n in params if "lora_" in n}
    assert {r for r in ("writer", "rewriter", "checker") if any(f".{r}." in n for n in adapters)} == {
        "writer",
        "rewriter",
    }
    # The checker runs on the base: every base weight is still the packaged model's.
    original = AutoModelForCausalLM.from_pretrained(smollm2_cache / SMOLLM2, dtype=torch.float32).state_dict()
    compared = 0
    for name, param in params.items():
        if "lora_" in name:
            continue
        key = name.removeprefix("base_model.model.").replace(".base_layer", "")
        assert torch.equal(param.detach().float(), original[key].float()), name
        compared += 1
    assert compared == len(original) or compared >= 200


def test_both_configs_share_one_warm_start() -> None:
    plain, lora = (
        load_run_config(EXAMPLE / name) for name in ("config_smollm2.toml", "config_smollm2_lora.toml")
    )
    assert plain.warm_start is not None and plain.warm_start == lora.warm_start
    assert plain.model.path == lora.model.path
    assert plain.warm_start.agents is None  # the checker's verdicts are trained too: RL keeps it frozen
    assert plain.warm_start.max_tokens <= plain.trainer.rollouts.max_tokens


def _policy() -> Any:
    """The policy module (`reply`, `plan`, `MIX`, ...), as the config names it."""
    import sql_smollm2_policy

    cfg = load_run_config(EXAMPLE / "config_smollm2.toml")
    assert cfg.warm_start is not None and cfg.warm_start.policy == "sql_smollm2_policy:reply"
    return sql_smollm2_policy


def _ask(messages: list[Any]) -> str:
    from langchain_core.messages import convert_to_openai_messages

    request = GenerationRequest(messages=convert_to_openai_messages(messages))
    return str(_policy().reply(request))


def planned_conversation(task: dict[str, Any]) -> tuple[float, Counter[str]]:
    """The graph's loop (sql_smollm2.py's prompts, sql_agent.py's routing) answered by the policy,
    without the gateway: the last query's reward and the calls per role. The checker's verdict is
    checked against the rows it was shown at every turn: WRONG for an error or none, else OK."""
    from sql_agent import MAX_ROUNDS, run_preview
    from sql_data import database_path, execution_match, extract_sql
    from sql_smollm2 import checker_messages, rewriter_messages, writer_messages

    schema, question, db = str(task["schema"]), str(task["question"]), str(task["db_id"])
    calls: Counter[str] = Counter(writer=1)
    sql, rounds = extract_sql(_ask(writer_messages(schema, question))), 1
    while True:
        preview = run_preview(db, sql)
        verdict = _ask(checker_messages(question, sql, preview))
        calls["checker"] += 1
        right = execution_match(database_path(db), sql, str(task["gold_sql"]))
        failed = preview == "none" or preview.startswith("error:")
        assert verdict == ("WRONG" if failed else "OK"), (question, sql, preview)
        if verdict == "OK" or rounds >= MAX_ROUNDS:
            return right, calls
        sql, rounds = extract_sql(_ask(rewriter_messages(schema, question, sql, preview))), rounds + 1
        calls["rewriter"] += 1


def test_the_policy_plans_each_role_and_the_designed_mix(smollm2_cache: Path) -> None:
    from sql_data import database_path, execution_match, train_tasks

    policy = _policy()
    tokenizer = AutoTokenizer.from_pretrained(smollm2_cache / SMOLLM2)
    cfg = load_run_config(EXAMPLE / "config_smollm2.toml")
    assert cfg.warm_start is not None and cfg.warm_start.tasks == 400
    tasks = train_tasks()[: cfg.warm_start.tasks]
    kinds: Counter[str] = Counter()
    ended_right, calls = 0.0, Counter[str]()
    longest = 0
    for task in tasks:
        schema, question, gold = str(task["schema"]), str(task["question"]), str(task["gold_sql"])
        drawn = policy.plan(schema, question)
        assert drawn == policy.plan(schema, question) and drawn.gold == gold  # one plan per question
        db = database_path(str(task["db_id"]))
        if drawn.kind == "right":
            assert drawn.writer == gold
        else:  # a mistake that returns something else (or fails) on the task's own database
            assert drawn.writer != gold and not execution_match(db, drawn.writer, gold)
            if drawn.kind == "unquoted":
                assert drawn.writer == policy.unquoted(gold) and "'" not in drawn.writer
            else:
                assert drawn.writer in task["wrong_sql"]
            if drawn.kind == "flipped":  # one decisive token reversed
                assert policy.flipped(gold, [drawn.writer]) == drawn.writer
            if drawn.kind == "near_miss":  # only a question without a systematic mistake (an unquoted
                assert policy.flipped(gold, list(task["wrong_sql"])) is None  # value may still match)
        assert all(not execution_match(db, m, gold) for m in drawn.mistakes)
        kinds[drawn.kind] += 1
        reward, used = planned_conversation(task)
        ended_right += reward
        calls += used
        for sql in (gold, *drawn.mistakes):  # every reply the writer or rewriter can give, with <|im_end|>
            longest = max(longest, len(tokenizer.encode(sql, add_special_tokens=False)) + 1)
    # The designed mix (sql_smollm2_policy.MIX): the writer's mistake is the likelier turn (0.65), and
    # mostly a systematic one. A flip runs and shows rows, so the checker passes it; an unquoted value's
    # error sends the query to the rewriter, gold 30% of the time, else handed back unchanged.
    wrong = (kinds["unquoted"] + kinds["flipped"] + kinds["near_miss"]) / len(tasks)
    assert 0.57 < wrong < 0.73, kinds
    assert kinds["unquoted"] + kinds["flipped"] > 3 * kinds["near_miss"], kinds
    assert 0.37 <= ended_right / len(tasks) <= 0.46, ended_right
    assert calls["writer"] == len(tasks)
    assert kinds["unquoted"] <= calls["rewriter"] <= 3 * kinds["unquoted"] + 30  # a few near misses find none
    assert calls["checker"] == calls["writer"] + calls["rewriter"]  # every query is checked once
    assert longest <= cfg.warm_start.max_tokens
    for verdict in ("OK", "WRONG"):  # the agent gives the checker 4 tokens
        assert len(tokenizer.encode(verdict, add_special_tokens=False)) + 1 <= 4


def test_the_rewriter_fixes_or_hands_the_query_back() -> None:
    from sql_data import train_tasks

    policy = _policy()
    outcomes: Counter[str] = Counter()
    for task in train_tasks()[:200]:
        schema, question = str(task["schema"]), str(task["question"])
        drawn = policy.plan(schema, question)
        if drawn.kind == "right":
            continue
        again = policy.rewrite(schema, question, drawn.writer)
        assert again == policy.rewrite(schema, question, drawn.writer)  # drawn once per rejected query
        assert again in (drawn.gold, drawn.writer)
        outcomes["fixed" if again == drawn.gold else "back"] += 1
    assert outcomes["back"] > outcomes["fixed"] > 0.25 * outcomes["back"]  # gold 30% of the time


def test_the_policy_refuses_a_held_out_question() -> None:
    from sql_data import val_tasks
    from sql_smollm2 import checker_messages, writer_messages

    task = val_tasks(1)[0]
    with pytest.raises(ValueError, match="held-out question"):
        _ask(writer_messages(str(task["schema"]), str(task["question"])))
    with pytest.raises(ValueError, match="held-out question"):
        _ask(checker_messages(str(task["question"]), str(task["gold_sql"]), "1"))


async def test_warm_start_traces_are_every_roles_own_tokens(smollm2_cache: Path) -> None:
    """`reinforge sft`'s recording step on the real tokenizer: the unchanged graph against the policy,
    each call its own example (writer, checker and rewriter), the rewards the plans' outcomes and the
    trained replies within the agent's limits."""
    cfg = load_run_config(EXAMPLE / "config_smollm2.toml")
    ws = cfg.warm_start
    assert ws is not None and ws.policy is not None
    from sql_data import train_tasks
    from sql_smollm2 import CHECKER_SYSTEM, DEMO_SQL, REWRITER_SYSTEM, WRITER_SYSTEM

    tasks = train_tasks()[:12]
    recorded = await record_warm_start(cfg, smollm2_cache, tasks)
    store, tokenizer = recorded.store, recorded.tokenizer
    rewards = recorded.rewards
    calls = Counter[str]()
    for task in tasks:  # the recorded reward is the planned conversation's
        reward, used = planned_conversation(task)
        assert rewards[str(task["question"])] == reward
        calls += used
    assert 0.0 < recorded.mean_reward < 1.0  # the mix: some right, some wrong

    examples = await trace_examples(store)
    assert len(examples) == sum(calls.values())  # separate prompts: one example per call
    roles = Counter[str]()
    for example in examples:
        prompt = tokenizer.decode(example.input_ids[: example.loss_mask.index(1)])
        trained_ids = [t for t, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
        trained = tokenizer.decode(trained_ids)
        assert prompt.startswith("<|im_start|>system\n") and prompt.endswith("<|im_start|>assistant\n")
        assert DEMO_SQL in prompt and trained.endswith("<|im_end|>")  # the demonstration is context
        role = next(
            r
            for r, s in (
                ("writer", WRITER_SYSTEM),
                ("checker", CHECKER_SYSTEM),
                ("rewriter", REWRITER_SYSTEM),
            )
            if s in prompt
        )
        roles[role] += 1
        if role == "checker":
            assert trained in ("OK<|im_end|>", "WRONG<|im_end|>") and len(trained_ids) <= 4
        else:
            assert trained.startswith("SELECT ") and len(trained_ids) <= ws.max_tokens
    assert roles == calls
