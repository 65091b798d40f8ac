"""Cheap checks of benchmarks/trainer_bench.py, _trl_side.py and learning_bench.py (no training runs).

The benchmarks themselves take minutes; these tests pin the pieces that decide their numbers: the
reward both trainers are scored with, and the summary that flags a collapse.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<tool_call>{"name":"calculator","arguments":{"expression":"58*2"}}</tool_call></s>', "58*2"),
        ('<tool_call>{"name":"calculator","arguments":"{\\"expression\\": \\"3 + 4\\"}"}</tool_call>', "3+4"),
        (
            '<tool_call>{"name":"calculator","arguments":{"expression":"1+2"}}</tool_call>'
            '<tool_call>{"name":"calculator","arguments":{"expression":"9*9"}}</tool_call>',
            "1+2",
        ),
        ("ANSWER: 12</s>", None),
        ('<tool_call>{"name":"calculator","arguments":{"expression":"1+2"}</s>', None),
        ('<tool_call>{"name":"search","arguments":{"expression":"1+2"}}</tool_call>', None),
        ('<tool_call>{"name":"calculator","arguments":{"expr":"1+2"}}</tool_call>', None),
    ],
)
def test_first_tool_expression_reads_only_the_first_well_formed_call(text: str, expected: str | None) -> None:
    assert _load("_trl_side").first_tool_expression(text) == expected


def test_agent_side_and_trl_side_parse_arguments_alike() -> None:
    bench = _load("trainer_bench")
    assert bench.expression_of('{"expression": "12 - 3"}') == "12-3"
    assert bench.expression_of("{not json") is None
    assert bench.expression_of('{"expression": 5}') is None


def test_single_turn_tasks_expect_the_precedence_respecting_first_call() -> None:
    bench = _load("trainer_bench")
    tasks = bench.single_turn_tasks("val", 30, 1)
    assert len({t["question"] for t in tasks}) == 30
    for task in tasks:
        q, expected = task["question"], task["expected"]
        if "*" in q[1:] and ("+" in q or "-" in q[1:]) and q.index("*") > max(q.find("+"), q.rfind("-")):
            assert "*" in expected  # a + b * c starts with b * c
        assert expected in q


def test_learning_summary_flags_a_collapse_and_reads_metric_names() -> None:
    bench = _load("learning_bench")
    history = [
        {
            "step": s,
            "train/success": 0.3 - 0.1 * s,
            "policy/entropy": 0.5,
            "clip/frac": 0.01,
            "groups": 16.0,
            "groups_flat": 8.0,
            "update/grad_norm": 0.2,
            "transitions": 300.0,
            "credit/trained_tokens": 4000.0,
        }
        for s in range(1, 4)
    ]
    summary = {
        "variant": "per_call/equal",
        "before": {"val/success": 0.30, "val/greedy_success": 0.5},
        "after": {"val/success": 0.10, "val/greedy_success": 0.2},
        "steps": 3,
        "rl_minutes": 1.0,
        "wall_minutes": 2.0,
        "train_success": [r["train/success"] for r in history],
        "history": history,
    }
    text = bench.describe(summary)
    assert "0.300 -> 0.100" in text
    assert "flat groups 0.50/0.50" in text
    assert "COLLAPSE" in text


@pytest.mark.parametrize("module", ["trainer_bench", "learning_bench"])
def test_quick_flag_parses(module: str) -> None:
    args = _load(module).build_parser().parse_args(["--quick"])
    assert args.quick is True


@pytest.mark.parametrize(
    ("argv", "steps", "schedule"),
    [
        ([], None, "constant"),  # temperature 1: the budget its figures were measured with (20 steps later)
        (["--temperature", "0.7"], 30, "linear"),
        (["--temperature", "0.7", "--steps", "12", "--lr-schedule", "constant"], 12, "constant"),
        (["--temperature", "0.7", "--quick"], None, "linear"),
        (["--lr-schedule", "cosine"], None, "cosine"),
    ],
)
def test_learning_defaults_depend_on_the_temperature(
    argv: list[str], steps: int | None, schedule: str
) -> None:
    bench = _load("learning_bench")
    args = bench.build_parser().parse_args(argv)
    bench.apply_temperature_defaults(args)
    assert (args.steps, args.lr_schedule) == (steps, schedule)
