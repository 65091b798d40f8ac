"""Every shipped Harbor task: its tests fail on the starting files and pass after the reference
solution (solution/solve.sh), scored by the verifier the harness runs use."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from reinforge.errors import InvalidRequestError
from reinforge.harnesses import HarnessAgent, MiniSweAgent, RewardMode, UnconfinedSandbox, load_tasks
from reinforge.harnesses.tasks import HarborTask, load_task, task_from_rollout

TASKS_ROOT = Path(__file__).resolve().parents[2] / "examples" / "harnesses" / "tasks"
TASKS = load_tasks(TASKS_ROOT)


def test_a_dozen_tasks_ship() -> None:
    assert len(TASKS) >= 12
    for task in TASKS:
        assert task.instruction.strip()
        assert (task.solution_dir / "solve.sh").is_file()
        assert task.agent_timeout_s == 120.0 and task.verifier_timeout_s == 60.0
        assert task.memory_mb == 2048


async def _score(
    task: HarborTask, tmp_path: Path, *, solve: bool, mode: RewardMode
) -> tuple[float, int | None]:
    agent = HarnessAgent(MiniSweAgent(), attempts_dir=tmp_path, sandbox=UnconfinedSandbox(), reward_mode=mode)
    work = tmp_path / "work"
    task.copy_environment(work)
    assert not (work / "Dockerfile").exists()
    if solve:
        subprocess.run(["bash", str(task.solution_dir / "solve.sh")], cwd=work, check=True)
    home = tmp_path / "home"
    home.mkdir()
    outcome = await agent.run_tests(
        task, work=work, tests=tmp_path / "tests", logs=tmp_path / "logs", hide=(), home=home
    )
    assert outcome.source == "junit"
    return outcome.reward, outcome.passed


@pytest.mark.parametrize("task", TASKS, ids=[t.name for t in TASKS])
async def test_tests_fail_before_and_pass_after_the_reference_solution(
    task: HarborTask, tmp_path: Path
) -> None:
    before, _ = await _score(task, tmp_path / "before", solve=False, mode=RewardMode.fraction)
    assert before < 1.0
    after, passed = await _score(task, tmp_path / "after", solve=True, mode=RewardMode.all_or_nothing)
    assert after == 1.0 and passed


async def test_fraction_counts_each_test(tmp_path: Path) -> None:
    # add-cli-flag: the plain greeting already passes, the two --shout tests do not.
    task = load_task(TASKS_ROOT / "add-cli-flag")
    assert await _score(task, tmp_path / "f", solve=False, mode=RewardMode.fraction) == (
        pytest.approx(1 / 3),
        1,
    )
    assert await _score(task, tmp_path / "a", solve=False, mode=RewardMode.all_or_nothing) == (0.0, 1)


def test_rollout_task_names_a_folder_inside_the_root(tmp_path: Path) -> None:
    assert task_from_rollout({"harbor_task": "write-file"}, TASKS_ROOT).name == "write-file"
    with pytest.raises(InvalidRequestError, match="leaves tasks_root"):
        task_from_rollout({"harbor_task": "../add-cli-flag"}, TASKS_ROOT / "write-file")
    with pytest.raises(InvalidRequestError, match="harbor_task"):
        task_from_rollout({"prompt": "x"}, TASKS_ROOT)
    with pytest.raises(InvalidRequestError, match=r"no instruction\.md"):
        load_task(tmp_path)
