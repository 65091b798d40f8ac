"""The reward of an attempt: the task's tests, run in the attempt's directory after the harness.

Which result counts, first found wins:
1. `$LOGS_DIR/junit.xml` (pytest `--junitxml`): passed / total per test; `all_or_nothing` gives 1.0
   only when every test passed.
2. `$LOGS_DIR/reward.txt` (Harbor's verifier contract): the number in it; `all_or_nothing` rounds
   anything below 1 down to 0.
3. test.sh's exit status: 0 is 1.0, anything else 0.0.
A verifier that runs out of time scores 0.0, whatever it wrote.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from enum import Enum
from pathlib import Path


class RewardMode(str, Enum):
    fraction = "fraction"
    all_or_nothing = "all_or_nothing"


@dataclass(frozen=True)
class TestOutcome:
    reward: float
    passed: int | None
    total: int | None
    source: str
    """Which result gave the reward: `junit`, `reward.txt`, `exit_status` or `timeout`."""


def junit_counts(path: Path) -> tuple[int, int] | None:
    """(passed, total) from a JUnit XML report; None when it is absent or unreadable."""
    try:
        root = ElementTree.parse(path).getroot()
    except (OSError, ElementTree.ParseError):
        return None
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    total = failed = 0
    for suite in suites:
        for case in suite.iter("testcase"):
            total += 1
            if any(case.find(tag) is not None for tag in ("failure", "error", "skipped")):
                failed += 1
    return total - failed, total


def score(logs: Path, exit_code: int, timed_out: bool, mode: RewardMode) -> TestOutcome:
    """The reward from what the verifier left in `logs` (see the module docstring)."""
    if timed_out:
        return TestOutcome(0.0, None, None, "timeout")
    counts = junit_counts(logs / "junit.xml")
    if counts is not None and counts[1] > 0:
        passed, total = counts
        if mode is RewardMode.all_or_nothing:
            reward = 1.0 if passed == total and exit_code == 0 else 0.0
        else:
            reward = passed / total
        return TestOutcome(reward, passed, total, "junit")
    reward_file = logs / "reward.txt"
    if reward_file.is_file():
        try:
            value = min(1.0, max(0.0, float(reward_file.read_text().strip())))
        except ValueError:
            value = 0.0
        if mode is RewardMode.all_or_nothing:
            value = 1.0 if value >= 1.0 else 0.0
        return TestOutcome(value, None, None, "reward.txt")
    return TestOutcome(1.0 if exit_code == 0 else 0.0, None, None, "exit_status")
