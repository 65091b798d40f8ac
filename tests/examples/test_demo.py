"""`reinforge demo` end to end with a tiny budget, and the warm-start rebuild it depends on."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import PreTrainedTokenizerBase
from typer.testing import CliRunner

from reinforge.cli import app
from reinforge.demo.calculator import CALCULATOR_TOOL, calculate, call_calculator
from reinforge.demo.run import DemoSettings, run_demo
from reinforge.demo.tasks import val_tasks
from reinforge.demo.traces import TraceMix, tool_call_message, tool_result_message
from reinforge.demo.warm_start import (
    SHIPPED_WARM_START,
    SftPhase,
    WarmStartConfig,
    build_warm_start,
    load_warm_start,
)
from reinforge.engine import Engine
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams
from reinforge.inference.tool_calls import parse_tool_calls
from reinforge.models import CHAT_TEMPLATE
from reinforge.training.sft import SftConfig

torch.set_num_threads(1)
RESULT = re.compile(
    r"^RESULT demo_heldout_success before=(\d\.\d{3}) after=(\d\.\d{3}) "
    r"greedy_before=(\d\.\d{3}) greedy_after=(\d\.\d{3}) rl_minutes=(\d+\.\d{2})$"
)
TINY = WarmStartConfig(
    num_traces=96,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    intermediate_size=64,
    sft_phases=[
        SftPhase(sft=SftConfig(steps=3, batch_size=8, warmup_steps=1)),
        SftPhase(sft=SftConfig(steps=1, batch_size=8, seed=1), mix=TraceMix(left_to_right=0.0)),
    ],
)


@pytest.fixture(scope="module")
def tiny_warm_start(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run") / "warm_start"
    report = build_warm_start(out, TINY)
    assert report.steps == 4 and report.last_loss < report.first_loss
    return out


def test_rebuilt_warm_start_loads_with_the_chat_template(tiny_warm_start: Path) -> None:
    model, tokenizer = load_warm_start(tiny_warm_start)
    assert model.config.hidden_size == 32 and tokenizer.chat_template == CHAT_TEMPLATE
    assert (tiny_warm_start / "warm_start.json").is_file()
    text = tokenizer.apply_chat_template([{"role": "user", "content": "7+18*2"}], tokenize=False)
    assert "<|user|>7+18*2</s>" in str(text)
    with pytest.raises(InvalidRequestError, match="rebuild-warm-start"):
        load_warm_start(tiny_warm_start / "missing")


def test_shipped_warm_start_is_small_and_loads() -> None:
    files = list(SHIPPED_WARM_START.iterdir())
    assert sum(f.stat().st_size for f in files) <= 5 * 1024 * 1024
    model, _ = load_warm_start()
    assert 0.9e6 < sum(p.numel() for p in model.parameters()) < 1.3e6


def test_demo_pipeline_runs_end_to_end_on_a_tiny_budget(tiny_warm_start: Path) -> None:
    run_dir = tiny_warm_start.parent  # the cached warm start in the run folder is picked up
    settings = DemoSettings(
        run_dir=run_dir, max_steps=1, minutes=1, tasks_per_step=2, group_size=2, val_size=4, progress=False
    )
    result = run_demo(settings)
    assert result.warm_start == tiny_warm_start
    assert result.fit.steps == 1 and result.fit.policy_version == 1
    match = RESULT.match(result.result_line())
    assert match is not None
    assert (run_dir / "reward_curve.png").is_file() and (run_dir / "store.db").is_file()


def test_demo_command_prints_the_result_line(tiny_warm_start: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "cli-run"
    run_dir.mkdir()
    (run_dir / "warm_start").symlink_to(tiny_warm_start, target_is_directory=True)
    out = CliRunner().invoke(app, ["demo", "--run-dir", str(run_dir), "--max-steps", "1", "--val-size", "2"])
    assert out.exit_code == 0, out.output
    assert RESULT.match(out.output.strip().splitlines()[-1])
    bad = CliRunner().invoke(app, ["demo", "--run-dir", str(run_dir), "--credit-mode", "sideways"])
    assert bad.exit_code == 2 and "error" in bad.output


def _expression(step: list[object]) -> str:
    return "".join(str(part) for part in step)


async def _two_calls(engine: Engine, tokenizer: PreTrainedTokenizerBase, task: dict[str, Any]) -> list[str]:
    """Greedy episode with the calculator, forced to continue after the first result: the calls made."""
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    calls: list[str] = []
    for turn in range(2):
        text = tokenizer.apply_chat_template(
            messages, tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True
        )
        ids = tokenizer(str(text), add_special_tokens=False)["input_ids"]
        forced = "<tool_call>" if turn == 1 else ""
        ids += tokenizer(forced, add_special_tokens=False)["input_ids"] if forced else []
        out = await engine.generate(ids, SamplingParams(temperature=0.0, max_tokens=40))
        parsed = parse_tool_calls(forced + out.text)
        if not parsed.tool_calls:
            break
        call = parsed.tool_calls[0]
        calls.append(json.loads(call.arguments)["expression"])
        messages.append(tool_call_message(f"call_{turn}", calls[-1]))
        messages.append(tool_result_message(f"call_{turn}", str(call_calculator(call.arguments))))
    return calls


def _prompt_after_first_result(tokenizer: PreTrainedTokenizerBase, task: dict[str, Any]) -> list[int]:
    first = _expression(task["steps"][0])
    history = [
        {"role": "user", "content": task["question"]},
        tool_call_message("call_0", first),
        tool_result_message("call_0", str(calculate(first))),
    ]
    text = tokenizer.apply_chat_template(
        history, tools=[CALCULATOR_TOOL], tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def test_shipped_warm_start_copies_right_but_answers_too_early() -> None:
    """The design RL has to undo: greedy answers right after the first calculator result (so greedy
    success starts near 0), although the model makes both calls right when it does continue."""
    model, tokenizer = load_warm_start()
    tasks = val_tasks(40)
    greedy = SamplingParams(temperature=0.0, max_tokens=40)

    async def run() -> tuple[list[list[str]], list[str]]:
        with Engine(model, tokenizer, max_batch_size=64) as engine:
            forced = await asyncio.gather(*[_two_calls(engine, tokenizer, t) for t in tasks])
            replies = await asyncio.gather(
                *[engine.generate(_prompt_after_first_result(tokenizer, t), greedy) for t in tasks]
            )
        return list(forced), [r.text for r in replies]

    forced, after_first = asyncio.run(run())
    right = sum(calls == [_expression(s) for s in t["steps"]] for calls, t in zip(forced, tasks, strict=True))
    assert right >= 0.9 * len(tasks)
    answered_early = sum(not parse_tool_calls(text).tool_calls for text in after_first)
    assert answered_early >= 0.8 * len(tasks)
