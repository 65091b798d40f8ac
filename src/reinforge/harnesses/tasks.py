"""Tasks as folders in the Harbor layout (terminal-bench's successor):

    my-task/
      instruction.md      what the harness is told
      task.toml           [agent] timeout_sec, [verifier] timeout_sec, [environment] cpus, memory_mb
      environment/        the starting files (copied into the attempt's working directory)
      tests/test.sh       the verifier, run in that directory after the harness ends
      solution/solve.sh   a reference solution (checked by the tests, never shown to the harness)

Harbor builds `environment/Dockerfile` into a container; here the environment's files are the
working directory and the host's tools (inside the sandbox) are the container, so a Dockerfile is
not built (docs/harnesses.md says what that changes). The verifier gets Harbor's paths as
variables: `$TESTS_DIR` for `/tests` and `$LOGS_DIR` for `/logs/verifier`.
"""

from __future__ import annotations

import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reinforge.errors import InvalidRequestError

TASK_KEY = "harbor_task"
"""The key of a rollout's task dict that names the task folder (absolute, or under `tasks_root`)."""

_NOT_COPIED = {"Dockerfile", "docker-compose.yaml", "docker-compose.yml"}


@dataclass(frozen=True)
class HarborTask:
    path: Path
    instruction: str
    agent_timeout_s: float
    verifier_timeout_s: float
    memory_mb: int | None
    cpus: float | None
    config: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"

    def as_task(self) -> dict[str, Any]:
        """The rollout task that names this folder."""
        return {TASK_KEY: str(self.path)}

    def copy_environment(self, into: Path) -> None:
        """The starting files into `into` (which must not exist yet); the Dockerfile stays behind."""
        source = self.path / "environment"
        if source.is_dir():
            shutil.copytree(source, into, ignore=lambda _d, names: [n for n in names if n in _NOT_COPIED])
        else:
            into.mkdir(parents=True)


def _number(table: dict[str, Any], key: str, default: float | None) -> float | None:
    value = table.get(key, default)
    if value is not None and not isinstance(value, int | float):
        raise InvalidRequestError(f"task.toml: {key} must be a number, got {value!r}")
    return value


def load_task(path: str | Path) -> HarborTask:
    """One task folder, checked: instruction.md and tests/test.sh must exist."""
    folder = Path(path).resolve()
    instruction = folder / "instruction.md"
    if not instruction.is_file():
        raise InvalidRequestError(f"{folder} is not a Harbor task: it has no instruction.md")
    if not (folder / "tests" / "test.sh").is_file():
        raise InvalidRequestError(f"{folder} is not a Harbor task: it has no tests/test.sh")
    config: dict[str, Any] = {}
    if (folder / "task.toml").is_file():
        try:
            config = tomllib.loads((folder / "task.toml").read_text())
        except tomllib.TOMLDecodeError as e:
            raise InvalidRequestError(f"{folder}/task.toml: {e}") from e
    agent, verifier, env = (config.get(k, {}) for k in ("agent", "verifier", "environment"))
    memory = _number(env, "memory_mb", None)
    return HarborTask(
        path=folder,
        instruction=instruction.read_text(),
        agent_timeout_s=float(_number(agent, "timeout_sec", 600.0) or 600.0),
        verifier_timeout_s=float(_number(verifier, "timeout_sec", 120.0) or 120.0),
        memory_mb=int(memory) if memory is not None else None,
        cpus=_number(env, "cpus", None),
        config=config,
    )


def load_tasks(root: str | Path) -> list[HarborTask]:
    """Every task folder directly under `root`, by name."""
    folders = sorted(p for p in Path(root).iterdir() if (p / "instruction.md").is_file())
    if not folders:
        raise InvalidRequestError(f"no Harbor task folders (with instruction.md) under {root}")
    return [load_task(p) for p in folders]


def task_from_rollout(task: dict[str, Any], tasks_root: Path | None) -> HarborTask:
    """The task folder a rollout's task dict names."""
    name = task.get(TASK_KEY)
    if not isinstance(name, str) or not name:
        raise InvalidRequestError(f"a harness task needs {TASK_KEY!r} (a task folder), got {task!r}")
    path = Path(name)
    if not path.is_absolute():
        if tasks_root is None:
            raise InvalidRequestError(f"task {name!r} is relative and no tasks_root was given")
        path = tasks_root / path
        if not path.resolve().is_relative_to(tasks_root.resolve()):
            raise InvalidRequestError(f"task {name!r} leaves tasks_root")
    return load_task(path)
