"""Warm starts from traces: the agent runs unchanged against a scripted policy through the real gateway
and SQLite store, `trace_examples` gives back exactly the recorded token ids, and `reinforge sft`
chains both into a saved model."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from reinforge import semconv
from reinforge.cli import app
from reinforge.demo.agent import calc_agent
from reinforge.demo.tasks import train_tasks
from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.models import CHAT_TEMPLATE
from reinforge.store.factory import open_store
from reinforge.training.collect import (
    collect_traces,
    recorded_rollouts,
    tokenizer_fingerprint,
    trace_examples,
)
from reinforge.types import SpanQuery

from .conftest import small_model


def solving_policy(request: GenerationRequest) -> ScriptedReply:
    """Two calculator calls then the answer, or a wrong answer at once for questions starting '1'."""
    messages = request.messages or []
    question = next(str(m["content"]) for m in messages if m["role"] == "user")
    task = next(t for t in train_tasks() if t["question"] == question)
    done = sum(1 for m in messages if m["role"] == "assistant")
    if question.startswith("1"):
        return ScriptedReply(text="ANSWER: -1")
    steps: list[Any] = task["steps"]
    if done < 2:
        a, op, b = steps[done]
        if done == 1:  # the second call uses the first result, as the calculator returned it
            prior = next(m for m in reversed(messages) if m["role"] == "tool")
            a = int(str(prior["content"]))
        return ScriptedReply(
            tool_calls=[ScriptedToolCall(name="calculator", arguments={"expression": f"{a}{op}{b}"})]
        )
    return ScriptedReply(text=f"ANSWER: {task['answer']}")


def test_recorded_traces_give_the_exact_tokens_and_only_generated_ones_train(
    tokenizer: Any, tmp_path: Path
) -> None:
    tokenizer.chat_template = CHAT_TEMPLATE
    tasks = train_tasks()[:12]

    async def run() -> tuple[Any, list[Any], list[Any], list[Any]]:
        store = await open_store(f"sqlite:///{tmp_path / 'traces.db'}")
        try:
            backend = ScriptedBackend(tokenizer, solving_policy, compact_json=True)
            report = await collect_traces(calc_agent, tasks, backend, store, concurrency=4, max_tokens=64)
            examples = await trace_examples(store)
            solved = await trace_examples(store, min_reward=1.0)
            spans = (await store.query_spans(SpanQuery(limit=1000))).items
            return report, examples, solved, spans
        finally:
            await store.close()

    report, examples, solved, spans = asyncio.run(run())
    wrong = sum(1 for t in tasks if str(t["question"]).startswith("1"))
    assert report.rollouts == len(tasks) and report.succeeded == len(tasks)
    assert report.mean_reward == pytest.approx((len(tasks) - wrong) / len(tasks))
    assert len(examples) == len(tasks)  # each conversation merged into one sequence
    assert len(solved) == len(tasks) - wrong
    calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
    recorded = {tuple(s.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]) for s in calls}
    for example in solved:
        text = tokenizer.decode(example.input_ids)
        assert text.count("<tool_call>") == 2 and "ANSWER: " in text
        trained = [i for i, m in zip(example.input_ids, example.loss_mask, strict=True) if m]
        # What carries loss is the concatenation of recorded completions, nothing else.
        pieces = [c for c in recorded if _contains(trained, list(c))]
        assert sum(len(p) for p in pieces) == len(trained)
        # The tool results and the prompt are context only.
        tool_result = tokenizer.decode(
            [i for i, m in zip(example.input_ids, example.loss_mask, strict=True) if not m]
        )
        assert "<|tool|>" in tool_result and "<|user|>" in tool_result


def _contains(seq: list[int], part: list[int]) -> bool:
    return any(seq[i : i + len(part)] == part for i in range(len(seq) - len(part) + 1))


POLICY = """
from reinforge.inference.scripted import ScriptedReply

def reply(request):
    return ScriptedReply(text="ANSWER: 7")
"""


def write_config(folder: Path, tokenizer: Any, *, policy: bool = True) -> Path:
    tokenizer.chat_template = CHAT_TEMPLATE
    model = small_model(tokenizer)
    model.save_pretrained(folder / "base")
    tokenizer.save_pretrained(folder / "base")
    (folder / "answer_policy.py").write_text(POLICY)
    (folder / "train.jsonl").write_text("".join(json.dumps(t) + "\n" for t in train_tasks()[:6]))
    config = folder / "run.toml"
    config.write_text(
        f"""
[model]
path = "warm"
[agent]
entry = "reinforge.demo.agent:calc_agent"
[data]
train = "train.jsonl"
[warm_start]
base = "base"
{'policy = "answer_policy:reply"' if policy else ""}
store = "traces.db"
out = "warm"
concurrency = 3
[warm_start.sft]
steps = 3
batch_size = 4
warmup_steps = 1
"""
    )
    return config


async def _recorded_count(path: Path) -> int:
    store = await open_store(f"sqlite:///{path}")
    try:
        return len(await recorded_rollouts(store))
    finally:
        await store.close()


def test_sft_command_records_trains_and_saves_a_loadable_model(tokenizer: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path, tokenizer)
    out = CliRunner().invoke(app, ["sft", str(config)])
    assert out.exit_code == 0, out.output
    assert "recorded 6/6 rollouts" in out.output
    assert "trained 3 steps (float32) on 6 sequences" in out.output
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(str(tmp_path / "warm"))
    assert loaded.config.vocab_size == small_model(tokenizer).config.vocab_size
    assert AutoTokenizer.from_pretrained(str(tmp_path / "warm")).chat_template == CHAT_TEMPLATE

    # A second run trains on the traces already recorded instead of recording again.
    again = CliRunner().invoke(app, ["sft", str(config), "--steps", "1"])
    assert again.exit_code == 0, again.output
    assert "rollouts in" not in again.output and "trained 1 steps (float32) on 6 sequences" in again.output

    assert asyncio.run(_recorded_count(tmp_path / "traces.db")) == 6


def test_recollect_trains_on_the_new_recording_alone(tokenizer: Any, tmp_path: Path) -> None:
    """Recording again is what a changed policy asks for: the earlier recording (same tokenizer) stays
    in the store but is not trained on, or the two plans would be mixed."""
    config = write_config(tmp_path, tokenizer)
    assert CliRunner().invoke(app, ["sft", str(config), "--steps", "1"]).exit_code == 0
    again = CliRunner().invoke(app, ["sft", str(config), "--steps", "1", "--recollect"])
    assert again.exit_code == 0, again.output
    assert "recorded 6/6 rollouts" in again.output and "on 6 sequences" in again.output
    assert asyncio.run(_recorded_count(tmp_path / "traces.db")) == 12
    plain = CliRunner().invoke(app, ["sft", str(config), "--steps", "1"])  # no recording: all of them
    assert plain.exit_code == 0 and "on 12 sequences" in plain.output, plain.output


def test_traces_of_another_tokenizer_are_refused_and_left_out_once_recorded_anew(
    tokenizer: Any, tmp_path: Path
) -> None:
    """Recorded ids are only right for the tokenizer that made them: a base with another tokenizer
    must not train on them (it would learn the wrong pieces), and nothing recorded is deleted."""
    from transformers import AutoTokenizer

    config = write_config(tmp_path, tokenizer)
    first = CliRunner().invoke(app, ["sft", str(config)])
    assert first.exit_code == 0, first.output
    saved = AutoTokenizer.from_pretrained(str(tmp_path / "base"))
    # a saved and reloaded tokenizer is the same tokenizer: a second phase from a folder may reuse traces
    assert tokenizer_fingerprint(saved) == tokenizer_fingerprint(tokenizer)

    saved.chat_template = CHAT_TEMPLATE.replace("<|user|>", "<|human|>")
    saved.save_pretrained(tmp_path / "base")
    assert tokenizer_fingerprint(saved) != tokenizer_fingerprint(tokenizer)
    refused = CliRunner().invoke(app, ["sft", str(config)])
    assert refused.exit_code == 2
    assert "recorded with another tokenizer" in refused.output and "--recollect" in refused.output

    again = CliRunner().invoke(app, ["sft", str(config), "--recollect"])
    assert again.exit_code == 0, again.output
    assert "recorded 6/6 rollouts" in again.output
    assert "on 6 sequences" in again.output  # the new recording only, not the other tokenizer's 6

    # the first recording is kept, only left out
    assert asyncio.run(_recorded_count(tmp_path / "traces.db")) == 12


def test_sft_command_errors_are_clear(tokenizer: Any, tmp_path: Path) -> None:
    config = write_config(tmp_path, tokenizer, policy=False)
    out = CliRunner().invoke(app, ["sft", str(config)])
    assert out.exit_code == 2
    assert "holds no finished rollouts and [warm_start] names no policy" in out.output
    bare = tmp_path / "bare.toml"
    bare.write_text('[agent]\nentry = "reinforge.demo.agent:calc_agent"\n[data]\ntrain = "train.jsonl"\n')
    out = CliRunner().invoke(app, ["sft", str(bare)])
    assert out.exit_code == 2 and "no [warm_start] section" in out.output


def test_sft_command_rewrites_each_drawn_conversation_with_the_named_function(
    tokenizer: Any, tmp_path: Path
) -> None:
    config = write_config(tmp_path, tokenizer)
    (tmp_path / "seen_rewrite.py").write_text(
        "SEEN = []\n\ndef rename(segments, rng):\n    SEEN.append(list(segments))\n    return segments\n"
    )
    config.write_text(
        config.read_text().replace('out = "warm"\n', 'out = "warm"\nrewrite = "seen_rewrite:rename"\n')
    )
    out = CliRunner().invoke(app, ["sft", str(config)])
    assert out.exit_code == 0, out.output
    import sys

    seen = sys.modules["seen_rewrite"].SEEN
    assert len(seen) == 3 * 4  # every example of every batch: 3 steps of 4
    assert all(len(s) >= 2 and "ANSWER: " in "".join(s) for s in seen)  # context, then trained text

    config.write_text(config.read_text().replace("seen_rewrite:rename", "seen_rewrite:absent"))
    bad = CliRunner().invoke(app, ["sft", str(config)])
    assert bad.exit_code == 2 and "cannot load rewrite 'seen_rewrite:absent'" in bad.output


def test_help_names_the_toml_sections() -> None:
    out = CliRunner().invoke(app, ["sft", "--help"])
    assert out.exit_code == 0
    assert "[warm_start] section" in out.output and "[warm_start.sft] steps" in out.output


def test_sft_trains_handing_freed_memory_back_unless_told_not_to(
    tokenizer: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The warm start's fine-tuning runs inside `returning_freed_memory` (batches of changing lengths
    otherwise leave their activations resident), and `return_freed_memory = false` turns it off."""
    import contextlib
    from collections.abc import Iterator

    from reinforge.training import warm_start

    seen: list[tuple[bool, int]] = []  # (enabled, SFT steps taken when the block closed)
    steps: list[int] = []

    @contextlib.contextmanager
    def recording(enabled: bool = True) -> Iterator[None]:
        yield
        seen.append((enabled, len(steps)))

    monkeypatch.setattr(warm_start, "returning_freed_memory", recording)
    original = warm_start.supervised_finetune

    def counting(*args: Any, **kwargs: Any) -> Any:
        report = original(*args, **kwargs)
        steps.append(report.steps)
        return report

    monkeypatch.setattr(warm_start, "supervised_finetune", counting)
    config = write_config(tmp_path, tokenizer)
    assert CliRunner().invoke(app, ["sft", str(config)]).exit_code == 0
    config.write_text(config.read_text() + "return_freed_memory = false\n")  # in [warm_start.sft]
    assert CliRunner().invoke(app, ["sft", str(config), "--steps", "1"]).exit_code == 0
    assert seen == [(True, 1), (False, 2)]  # each fine-tuning ran inside the block, as configured
