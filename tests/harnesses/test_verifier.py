"""The reward from what a verifier leaves: a JUnit report, Harbor's reward.txt, or its exit status."""

from __future__ import annotations

from pathlib import Path

from reinforge.harnesses import RewardMode, score

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="4">
<testcase classname="t" name="a"/><testcase classname="t" name="b"/>
<testcase classname="t" name="c"><failure message="no"/></testcase>
<testcase classname="t" name="d"><error message="boom"/></testcase>
</testsuite></testsuites>"""


def test_junit_gives_the_fraction_or_all_or_nothing(tmp_path: Path) -> None:
    (tmp_path / "junit.xml").write_text(JUNIT)
    fraction = score(tmp_path, exit_code=1, timed_out=False, mode=RewardMode.fraction)
    assert (fraction.reward, fraction.passed, fraction.total, fraction.source) == (0.5, 2, 4, "junit")
    assert score(tmp_path, 1, False, RewardMode.all_or_nothing).reward == 0.0


def test_harbor_reward_file_then_exit_status(tmp_path: Path) -> None:
    (tmp_path / "reward.txt").write_text("0.75\n")
    assert score(tmp_path, 0, False, RewardMode.fraction).reward == 0.75
    assert score(tmp_path, 0, False, RewardMode.all_or_nothing).reward == 0.0
    (tmp_path / "reward.txt").unlink()
    assert score(tmp_path, 0, False, RewardMode.fraction).source == "exit_status"
    assert score(tmp_path, 0, False, RewardMode.fraction).reward == 1.0
    assert score(tmp_path, 2, False, RewardMode.fraction).reward == 0.0


def test_a_verifier_out_of_time_scores_zero(tmp_path: Path) -> None:
    (tmp_path / "reward.txt").write_text("1")
    outcome = score(tmp_path, 0, True, RewardMode.fraction)
    assert (outcome.reward, outcome.source) == (0.0, "timeout")
