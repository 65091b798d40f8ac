"""The calc task: problems, splits, the calculator tool and the warm-start traces."""

from __future__ import annotations

import json
import random

import pytest

from reinforge.demo.calculator import CalculatorError, calculate, call_calculator
from reinforge.demo.tasks import generate_tasks, is_held_out, make_task, train_tasks, val_tasks
from reinforge.demo.traces import TraceMix, synthetic_trace
from reinforge.errors import InvalidRequestError


def test_answers_respect_precedence() -> None:
    for task in generate_tasks("train", 300, seed=3):
        assert task.answer == eval(task.question)  # Python's precedence is the reference
        a, op, b = task.steps[0]
        assert task.question.count(f"{a}{op}{b}") >= 1 or task.conflict


def test_half_of_the_problems_have_a_precedence_conflict() -> None:
    tasks = generate_tasks("train", 1000, seed=0)
    share = sum(t.conflict for t in tasks) / len(tasks)
    assert 0.4 < share < 0.6
    conflict = make_task(7, "+", 18, "*", 2)
    assert conflict.conflict and conflict.steps == [(18, "*", 2), (7, "+", 36)] and conflict.answer == 43
    plain = make_task(4, "*", 20, "-", 4)
    assert not plain.conflict and plain.steps == [(4, "*", 20), (80, "-", 4)] and plain.answer == 76


def test_held_out_split_never_appears_in_training() -> None:
    train = {t["question"] for t in train_tasks(4000, seed=0)} | {
        t["question"] for t in train_tasks(4000, seed=9)
    }
    val = {t["question"] for t in val_tasks(500)}
    assert not train & val
    assert all(is_held_out(q) for q in val) and not any(is_held_out(q) for q in train)


def test_generation_is_deterministic_and_unique() -> None:
    a, b = generate_tasks("val", 50, seed=4), generate_tasks("val", 50, seed=4)
    assert a == b
    assert len({t.question for t in a}) == 50
    with pytest.raises(InvalidRequestError):
        generate_tasks("test", 1)  # type: ignore[arg-type]


def test_calculator_evaluates_exactly_one_operation() -> None:
    assert calculate("58*2") == 116
    assert calculate(" 37 + 116 ") == 153
    assert calculate("-5-3") == -8
    assert call_calculator('{"expression":"12-20"}') == -8
    for bad in ["37+58*2", "58", "2**3", "a+b", "", "1/2"]:
        with pytest.raises(CalculatorError):
            calculate(bad)
    for bad_args in ["not json", '{"expr": "1+2"}', "[1, 2]", '{"expression": 3}']:
        with pytest.raises(CalculatorError):
            call_calculator(bad_args)


def _answers(trace: list[dict]) -> int:
    return int(trace[-1]["content"].split("ANSWER: ")[1])


def _expressions(trace: list[dict]) -> list[str]:
    return [
        json.loads(m["tool_calls"][0]["function"]["arguments"])["expression"]
        for m in trace
        if m["role"] == "assistant" and m.get("tool_calls")
    ]


def test_right_strategy_traces_solve_the_task() -> None:
    right = TraceMix(guess=0, whole_expression=0, left_to_right=0, answer_early=0)
    rng = random.Random(0)
    for task in generate_tasks("train", 100, seed=1):
        trace = synthetic_trace(task, rng, right)
        assert _answers(trace) == task.answer
        assert _expressions(trace) == [f"{a}{op}{b}" for a, op, b in task.steps]
        tool_results = [m["content"] for m in trace if m["role"] == "tool"]
        assert [int(r) for r in tool_results] == [calculate(e) for e in _expressions(trace)]


def test_wrong_strategies_are_single_decisions_that_fail() -> None:
    rng = random.Random(0)
    task = make_task(7, "+", 18, "*", 2)
    early = synthetic_trace(task, rng, TraceMix(guess=0, whole_expression=0, left_to_right=0, answer_early=1))
    assert _expressions(early) == ["18*2"] and _answers(early) == 36
    ltr = synthetic_trace(task, rng, TraceMix(guess=0, whole_expression=0, left_to_right=1, answer_early=0))
    assert _expressions(ltr) == ["7+18", "25*2"] and _answers(ltr) == 50
    guesses = [synthetic_trace(task, rng, TraceMix(guess=1, whole_expression=0)) for _ in range(50)]
    assert all(len(g) == 2 and _answers(g) != task.answer for g in guesses)
    whole = synthetic_trace(task, rng, TraceMix(guess=0, whole_expression=1))
    assert _expressions(whole) == ["7+18*2"] and whole[2]["content"].startswith("error")


def test_default_mix_makes_answering_early_the_likely_choice() -> None:
    """The design the demo relies on: after the first result, 'answer now' outnumbers 'continue'."""
    rng = random.Random(0)
    traces = [synthetic_trace(t, rng) for t in generate_tasks("train", 2000, seed=2)]
    one_call = sum(1 for t in traces if len(_expressions(t)) == 1 and not t[2]["content"].startswith("error"))
    two_calls = sum(1 for t in traces if len(_expressions(t)) == 2)
    assert one_call > 1.2 * two_calls
    solved = sum(
        1
        for t, task in zip(traces, generate_tasks("train", 2000, seed=2), strict=True)
        if _answers(t) == task.answer
    )
    assert 0.2 < solved / len(traces) < 0.4


def test_mix_rejects_impossible_probabilities() -> None:
    with pytest.raises(ValueError):
        TraceMix(guess=0.8, whole_expression=0.5)
