"""The real-model demo's pieces: its task splits, its OpenAI-SDK agent through a real gateway and
runner on SmolLM2's tokenizer (scripted replies), and the figures it reports."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from reinforge.credit import CreditConfig, build_transitions
from reinforge.demo.real.agent import DEMONSTRATION, real_calc_agent, run_calculator
from reinforge.demo.real.report import RealDemoResult, StepSplit
from reinforge.demo.real.tasks import generate_tasks, is_held_out, train_tasks, val_tasks
from reinforge.errors import InvalidRequestError
from reinforge.gateway.app import create_gateway_app
from reinforge.inference import GenerationRequest, ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.net.background import BackgroundServer
from reinforge.runner import Runner
from reinforge.store.memory import MemoryStore
from reinforge.training.memory import PeakTreeRss
from reinforge.training.trainer import FitResult
from reinforge.types import AttemptQuery, RolloutSpec, SpanQuery

SECRET = "real-demo-gateway-secret-" + "r" * 16


def test_the_splits_are_disjoint_exact_and_deterministic() -> None:
    train = generate_tasks("train", 2000)
    held_out = generate_tasks("val", 300, seed=1)
    assert not {t.question for t in train} & {t.question for t in held_out}
    assert all(is_held_out(t.question) for t in held_out) and not any(is_held_out(t.question) for t in train)
    assert len({t.question for t in held_out}) == 300
    assert generate_tasks("val", 300, seed=1) == held_out
    for task in held_out[:50]:
        a, op, b = task.question.removeprefix("What is ").removesuffix("?").split(" ")
        assert task.answer == (int(a) + int(b) if op == "+" else int(a) * int(b))
        assert (op, task.kind) in (("+", "sum"), ("*", "product"))
        assert (len(a), len(b)) == ((2, 2) if op == "+" else (3, 2))
    sums = sum(t.kind == "sum" for t in held_out)
    assert 120 <= sums <= 180  # about half and half
    assert val_tasks(3)[0] == held_out[0].as_task() and len(train_tasks(5)) == 5
    with pytest.raises(InvalidRequestError):
        generate_tasks("test", 1)  # type: ignore[arg-type]


def test_the_calculator_tool_answers_and_refuses_as_text() -> None:
    assert run_calculator('{"expression": "417 * 23"}') == "9591"
    assert run_calculator('{"expression": "417 * 23 + 1"}').startswith("error: calculator takes exactly")
    assert run_calculator("not json").startswith("error: tool arguments are not JSON")


def calculator_then_answer(request: GenerationRequest) -> ScriptedReply:
    """What the trained policy does: call the calculator with the question's expression, then answer."""
    messages = request.messages or []
    last = messages[-1]
    if last["role"] == "tool":
        return ScriptedReply(text=f"ANSWER: {last['content']}")
    expression = str(last["content"]).removeprefix("What is ").removesuffix("?")
    call = ScriptedToolCall(name="calculator", arguments={"expression": expression})
    return ScriptedReply(tool_calls=[call])


def answer_from_the_head(request: GenerationRequest) -> ScriptedReply:
    """What the base model often does: answer without the tool (wrong)."""
    return ScriptedReply(text="ANSWER: 15")


@pytest.fixture
def serve() -> Iterator[Any]:
    from inference.real_tokenizer import smollm2_tokenizer

    servers: list[BackgroundServer] = []

    def start(policy: Any) -> tuple[MemoryStore, ScriptedBackend, str]:
        store = MemoryStore()
        backend = ScriptedBackend(smollm2_tokenizer(), policy)
        server = BackgroundServer(create_gateway_app(store, backend, SECRET))
        servers.append(server)
        return store, backend, server.start().url

    yield start
    for server in servers:
        server.stop()


async def run_tasks(store: MemoryStore, url: str, tasks: list[dict[str, object]]) -> list[Any]:
    rollouts = await store.enqueue_rollouts([RolloutSpec(task=t) for t in tasks])
    runner = Runner(store, real_calc_agent, url, SECRET, timeout_s=60, concurrency=len(tasks))
    stats = await runner.run(max_rollouts=len(tasks))
    assert stats.errors == []
    return await store.wait_for_rollouts([r.rollout_id for r in rollouts], 10.0)


async def test_the_agent_calls_the_calculator_and_is_rewarded_for_the_exact_answer(serve: Any) -> None:
    store, backend, url = serve(calculator_then_answer)
    tasks = val_tasks(4)
    finished = await run_tasks(store, url, tasks)
    assert [r.reward for r in finished] == [1.0] * 4
    # The model saw the tools in the gateway's default form and the demonstration as earlier turns.
    prompt = backend.decode(backend.prompt_ids(backend.requests[-1]))
    assert prompt.count('<tool_call>{"name": "calculator", "arguments": {"expression": ') == 3
    assert "What is 417 * 23?" in prompt and "What is 45 + 38?" in prompt
    assert prompt.count("<tool_response>\n") == 3  # two demonstrated results and this episode's
    assert prompt.rstrip().endswith("<|im_start|>assistant")
    # Each episode is one merged sample: the call and the answer, the tool result masked.
    rollout = finished[0]
    attempts = (await store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
    spans = (await store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=100))).items
    transitions, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"), attempts=attempts)
    merging = (metrics.calls, metrics.transitions, metrics.merged_calls, metrics.merge_mismatches)
    assert merging == (2, 1, 1, 0)
    assert transitions[0].reward == 1.0 and metrics.masked_tokens > 0
    assert len(DEMONSTRATION) == 9


async def test_an_answer_without_the_calculator_scores_zero(serve: Any) -> None:
    store, _, url = serve(answer_from_the_head)
    finished = await run_tasks(store, url, val_tasks(3))
    assert [r.reward for r in finished] == [0.0] * 3


def test_the_report_splits_a_step_and_prints_the_result_line(tmp_path: Any) -> None:
    step = {"time/step_s": 30.0, "time/collect_s": 20.0, "time/advantages_s": 0.5, "time/transitions_s": 0.5}
    history = [
        {"step": 0, "val/success": 0.2},
        {**step, "time/update_s": 8.0, "time/publish_s": 1.0},
        {**step, "time/update_s": 4.0, "time/publish_s": 1.0},
    ]
    split = StepSplit.of(history)
    phases = (split.generate, split.credit, split.update, split.publish)
    assert (split.steps, *phases) == (2, 20.0, 1.0, 6.0, 1.0)
    fit = FitResult(
        run_dir=tmp_path,
        steps=2,
        policy_version=2,
        rl_seconds=90.0,
        resumed_from=None,
        val_before={"val/success": 0.2, "val/greedy_success": 0.1},
        val_after={"val/success": 0.75, "val/greedy_success": 1.0},
        history=history,
    )
    result = RealDemoResult.of(fit, peak_rss_bytes=3_500_000_000)
    assert result.peak_rss_gb == 3.5
    assert result.result_line() == (
        "RESULT real_demo_heldout before=0.200 after=0.750 greedy_before=0.100 greedy_after=1.000 "
        "rl_minutes=1.50 steps=2"
    )


def test_peak_rss_adds_up_the_child_processes() -> None:
    hold = "import time; block = b'x' * 300_000_000; time.sleep(3)"
    with PeakTreeRss(interval_s=0.05) as peak:
        alone = peak.sample()
        child = subprocess.Popen([sys.executable, "-c", hold])
        try:
            child.wait(timeout=30)
        finally:
            child.kill()
    assert peak.bytes >= alone + 290_000_000


def test_the_demo_command_refuses_a_model_it_cannot_load(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from reinforge.cli import app

    missing = tmp_path / "missing.gguf"
    run_dir = tmp_path / "run"
    out = CliRunner().invoke(
        app, ["demo", "--model", str(missing), "--run-dir", str(run_dir), "--val-size", "2"]
    )
    assert out.exit_code == 2
    assert f"there is no GGUF file {missing}" in out.output.replace("\n", "")
