"""Rules every module under src/reinforge keeps: no class grows past 25 methods (a class that big does
several jobs), and no work-log text ("session 19", "this session") in code or docstrings, which says
when something was written rather than why it is so."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "reinforge"
MAX_METHODS = 25

WORK_LOG = re.compile(
    r"\b[Ss]ession \d+\b|\b[Tt]his session\b|\b[Ll]ast session\b|\b[Ii]ssue #?\d+\b|\b[Ww]ork[- ]log\b"
)
"""Dated history. "Session" alone stays allowed: a resumed training run is a run of several sessions."""


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _name(path: Path) -> str:
    return path.relative_to(SRC).as_posix()


def method_counts(source: str) -> dict[str, int]:
    """Every class in `source` (nested ones too) -> the number of defs directly in its body."""
    counts: dict[str, int] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            defs = [b for b in node.body if isinstance(b, (ast.FunctionDef, ast.AsyncFunctionDef))]
            counts[node.name] = len(defs)
    return counts


def _classes() -> list[tuple[str, int]]:
    return [
        (f"{_name(path)}::{cls}", n)
        for path in _modules()
        for cls, n in method_counts(path.read_text(encoding="utf-8")).items()
    ]


_CLASS_SIZES = dict(_classes())


@pytest.mark.parametrize("cls", list(_CLASS_SIZES))
def test_no_class_has_more_than_25_methods(cls: str) -> None:
    assert _CLASS_SIZES[cls] <= MAX_METHODS, f"{cls} has {_CLASS_SIZES[cls]} methods (at most {MAX_METHODS})"


@pytest.mark.parametrize("module", [_name(p) for p in _modules()])
def test_no_work_log_text(module: str) -> None:
    hits = [
        f"{module}:{no}: {line.strip()}"
        for no, line in enumerate((SRC / module).read_text(encoding="utf-8").splitlines(), start=1)
        if WORK_LOG.search(line)
    ]
    assert hits == []


def test_the_rules_catch_what_they_are_for() -> None:
    many = "class Big:\n" + "".join(f"    def m{i}(self) -> None: ...\n" for i in range(26))
    assert method_counts(many) == {"Big": 26}
    assert method_counts("class A:\n    x = 1\n    class B:\n        def f(self): ...\n") == {"A": 0, "B": 1}
    for text in ("docs, 'Session 19'", "as this session found", "see issue 35", "the last session's fix"):
        assert WORK_LOG.search(text), text
    for text in ("a resumed session's counters", "sessions before a resume", "aiohttp.ClientSession()"):
        assert not WORK_LOG.search(text), text
