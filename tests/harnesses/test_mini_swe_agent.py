"""mini-swe-agent, unchanged, completes shipped tasks through the real gateway: a scripted backend
answers as a capable model would (in mini-swe-agent's own fenced bash-block format), the runner
runs each attempt in its sandbox, and the task's tests give the reward."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge import semconv
from reinforge.credit import CreditConfig, build_transitions
from reinforge.harnesses import HarnessAgent, MiniSweAgent, bash_reply, load_task
from reinforge.harnesses.mini_swe_agent import SUBMIT
from reinforge.inference.contract import GenerationRequest
from reinforge.runner import Runner
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack, serve

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("minisweagent") is None, reason="mini-swe-agent is not installed"
)


def _solution(task: str) -> str:
    lines = (TASKS_ROOT / task / "solution" / "solve.sh").read_text().splitlines()
    return "\n".join(line for line in lines if not line.startswith(("#", "set -")))


SCRIPTS = {
    "write-file": ["ls -la", _solution("write-file"), "cat hello.txt", SUBMIT],
    "fix-failing-test": [
        "cat calc.py test_calc.py",
        _solution("fix-failing-test"),
        "python -m pytest -q -p no:cacheprovider test_calc.py",
        SUBMIT,
    ],
    "add-cli-flag": ["cat greet.py", _solution("add-cli-flag"), "python greet.py --name Ada --shout", SUBMIT],
}


def reply(request: GenerationRequest) -> str:
    """The next command of the task's script: the task from the first user turn, the step from
    how many assistant turns came before."""
    messages = request.messages or []
    first_user = next(str(m["content"]) for m in messages if m["role"] == "user")
    task = next(name for name in SCRIPTS if load_task(TASKS_ROOT / name).instruction.strip() in first_user)
    step = sum(1 for m in messages if m["role"] == "assistant")
    return bash_reply(SCRIPTS[task][step], thought=f"Step {step + 1} of {task}.")


@pytest.fixture
def gateway(harness_tokenizer: Any) -> Iterator[GatewayStack]:
    yield from serve(harness_tokenizer, reply)


async def test_mini_swe_agent_solves_three_tasks_through_the_gateway(
    gateway: GatewayStack, tmp_path: Path
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "store.token").write_text("not for attempts")
    agent = HarnessAgent(
        MiniSweAgent(step_limit=10),
        attempts_dir=run_dir / "attempts",
        tasks_root=TASKS_ROOT,
        hide=[run_dir],
        timeout_s=120,
    )
    tasks = [{"harbor_task": name} for name in SCRIPTS]
    rollouts = await gateway.store.enqueue_rollouts([RolloutSpec(task=t, max_attempts=1) for t in tasks])
    runner = Runner(gateway.store, agent, gateway.gateway_url, GATEWAY_SECRET, concurrency=3)
    stats = await runner.run(max_rollouts=3)

    results = {p.parent.name: json.loads(p.read_text()) for p in (run_dir / "attempts").glob("*/result.json")}
    assert (stats.succeeded, stats.failed) == (3, 0), results
    final = await gateway.store.wait_for_rollouts([r.rollout_id for r in rollouts], 30)
    for rollout in final:
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0
        spans = (await gateway.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        name = Path(rollout.task["harbor_task"]).name
        assert len(calls) == len(SCRIPTS[name])  # every call recorded, the submit included
        for call in calls:
            ids = call.attributes[semconv.ATTR_COMPLETION_TOKEN_IDS]
            assert ids and call.attributes[semconv.ATTR_PROMPT_TOKEN_IDS]
            assert len(call.attributes[semconv.ATTR_COMPLETION_LOGPROBS]) == len(ids)
        # mini-swe-agent only appends to its history: every call merges into one sample.
        transitions, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"))
        assert len(transitions) == 1 and transitions[0].num_calls == len(calls)
        assert (metrics.merged_calls, metrics.merge_mismatches) == (len(calls) - 1, 0)
        assert transitions[0].final_reward == 1.0
    for result in results.values():
        assert result["sandbox"] == "namespaces" and result["harness_exit_code"] == 0
        assert result["tests"]["source"] == "junit" and result["tests"]["reward"] == 1.0
    errors = [s for s in gateway.statuses.seen if s[2] >= 400]
    assert not errors, errors
    posts = [s for s in gateway.statuses.seen if s[0] == "POST" and s[1].endswith("/chat/completions")]
    assert len(posts) == sum(len(s) for s in SCRIPTS.values())
