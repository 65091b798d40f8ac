"""mini-swe-agent in the SmolLM2 format (`PLAIN_BASH`): its calls merge into one transition per
attempt (merge rate 1.0) on SmolLM2's real tokenizer and chat template.

A scripted backend answers in the forms SmolLM2-135M-Instruct writes: a ```bash block, an untagged
block, a reply cut off before its closing fence. mini-swe-agent (unchanged, configured through its
own `--config key=value`) parses each, so it keeps every reply in its history and each call extends
the one before. The regex and the config values are checked against mini-swe-agent's own parser.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest

from reinforge import semconv
from reinforge.credit import CreditConfig, CreditMetrics, build_transitions
from reinforge.harnesses import PLAIN_BASH, HarnessAgent, MiniSweAgent, load_task
from reinforge.harnesses.harness import HarnessContext
from reinforge.harnesses.mini_swe_formats import SUBMIT
from reinforge.inference.contract import GenerationRequest
from reinforge.runner import Runner
from reinforge.types import RolloutSpec, RolloutStatus, SpanQuery

from .conftest import GATEWAY_SECRET, TASKS_ROOT, GatewayStack, serve

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("minisweagent") is None, reason="mini-swe-agent is not installed"
)

# The forms SmolLM2 writes, each parsed by PLAIN_BASH's regex to the command (second item).
FORMS = [
    ("I list the files.\n```bash\nls -la\n```", "ls -la"),
    (
        "```\necho 'Hello, reinforge!' > hello.txt\n```\nThis writes the file.",
        "echo 'Hello, reinforge!' > hello.txt",
    ),
    ("Let me check.\n```sh\ncat hello.txt\n```\n```bash\nls\n```", "cat hello.txt"),  # first block wins
    ("The file is there, so I stop.\n```bash\n" + SUBMIT, SUBMIT),  # cut off before its fence
]
SCRIPTS = {
    "write-file": [reply for reply, _ in FORMS],
    "make-script-executable": [
        "I look at the script.\n```bash\ncat run.sh\n```",
        "```bash\nprintf '#!/bin/sh\\necho ok\\n' > run.sh && chmod +x run.sh\n```",
        "Now I run it.\n```\n./run.sh\n```",
        f"```bash\n{SUBMIT}\n```",
    ],
}


def test_the_regex_parses_what_smollm2_writes_as_mini_swe_agent_does() -> None:
    from minisweagent.exceptions import FormatError
    from minisweagent.models.utils.actions_text import parse_regex_actions

    def parse(content: str) -> list[dict[str, str]]:
        return parse_regex_actions(
            content,
            action_regex=PLAIN_BASH.action_regex,
            format_error_template=PLAIN_BASH.format_error_template,
        )

    for content, command in FORMS:
        assert parse(content) == [{"command": command}]
    with pytest.raises(FormatError):
        parse("I would run ls here, but without a code block.")


def test_the_format_reaches_mini_swe_agent_verbatim(tmp_path: Path) -> None:
    from minisweagent.config import get_config_from_spec
    from minisweagent.utils.serialize import recursive_merge

    ctx = HarnessContext(
        instruction="do it",
        base_url="http://127.0.0.1:1/v1",
        api_key="k",
        model="m",
        workdir=tmp_path,
        state_dir=tmp_path,
        timeout_s=10,
    )
    argv = MiniSweAgent(action_format=PLAIN_BASH, executable="mini").command(ctx)
    specs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--config"]
    config = recursive_merge(*(get_config_from_spec(spec) for spec in specs))
    assert config["model"]["action_regex"] == PLAIN_BASH.action_regex
    assert config["model"]["format_error_template"] == PLAIN_BASH.format_error_template
    assert config["agent"]["system_template"] == PLAIN_BASH.system_template
    assert config["agent"]["instance_template"] == PLAIN_BASH.instance_template
    assert config["model"]["observation_template"]  # the rest of mini_textbased.yaml still applies


def reply(request: GenerationRequest) -> str:
    messages = request.messages or []
    first_user = next(str(m["content"]) for m in messages if m["role"] == "user")
    task = next(name for name in SCRIPTS if load_task(TASKS_ROOT / name).instruction.strip() in first_user)
    return SCRIPTS[task][sum(1 for m in messages if m["role"] == "assistant")]


@pytest.fixture
def gateway() -> Iterator[GatewayStack]:
    from inference.real_tokenizer import smollm2_tokenizer

    yield from serve(smollm2_tokenizer(), reply)


async def test_plain_bash_calls_merge_on_smollm2s_tokenizer(gateway: GatewayStack, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    agent = HarnessAgent(
        MiniSweAgent(step_limit=6, action_format=PLAIN_BASH),
        attempts_dir=run_dir / "attempts",
        tasks_root=TASKS_ROOT,
        hide=[run_dir],
        timeout_s=60,
    )
    specs = [RolloutSpec(task={"harbor_task": name}, max_attempts=1) for name in SCRIPTS]
    rollouts = await gateway.store.enqueue_rollouts(specs)
    stats = await Runner(gateway.store, agent, gateway.gateway_url, GATEWAY_SECRET, concurrency=2).run(
        max_rollouts=len(SCRIPTS)
    )
    assert (stats.succeeded, stats.failed) == (len(SCRIPTS), 0)

    total = CreditMetrics()
    for rollout in await gateway.store.wait_for_rollouts([r.rollout_id for r in rollouts], 30):
        assert rollout.status == RolloutStatus.succeeded and rollout.reward == 1.0
        spans = (await gateway.store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
        calls = [s for s in spans if s.name == semconv.SPAN_LLM_CALL]
        assert len(calls) == len(SCRIPTS[Path(rollout.task["harbor_task"]).name])  # every reply parsed
        transitions, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"))
        assert len(transitions) == 1 and transitions[0].num_calls == len(calls)
        total = total + metrics
    flat = total.as_dict()
    assert flat["credit/merge_rate"] == 1.0 and total.merge_mismatch_reasons == {}
    assert (total.merged_transitions, total.calls) == (len(SCRIPTS), sum(len(s) for s in SCRIPTS.values()))
    assert total.history_unmatched == 0
    assert not [s for s in gateway.statuses.seen if s[2] >= 400]
