"""Runner processes for a training run: the agents' Python on cores of its own.

In-process agents share one interpreter lock with the gateway, the store and the engine's scheduler,
so their own Python (an OpenAI SDK call is milliseconds of it) serialises every step. With
`TrainerConfig.runners.processes = N` the trainer starts N `reinforge runner` children instead: each
leases from the trainer's store over HTTP and sends its agents' calls to the same gateway, exactly as
a runner on another machine would, and the trainer's process keeps only the serving and learning.

A child imports the agent by reference, so the agent must be reachable by name: a module-level
function (decorated or not), `Agent` subclass or instance, in an importable module or in the script
being run.
"""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from reinforge.errors import InvalidRequestError
from reinforge.runner.agent import Agent, attribute_at
from reinforge.runner.command import CommandAgent

_LOG_TAIL_CHARS = 2000


def agent_reference(agent: object) -> str:
    """`module:qualname` (or `/path/script.py:qualname` for the running script) naming `agent`.

    Raises InvalidRequestError when a child process could not find the very same object by that name.
    """
    if isinstance(agent, CommandAgent):
        raise InvalidRequestError(
            "runners.processes is for Python agents; a command agent already runs in its own process "
            "(leave runners.processes at 0)"
        )
    target: Any = agent
    if isinstance(agent, Agent) and not hasattr(agent, "__qualname__"):
        target = type(agent)  # an instance: found below as a module attribute of its class's module
    module_name = getattr(target, "__module__", None)
    qualname = getattr(target, "__qualname__", None)
    if not isinstance(module_name, str) or not isinstance(qualname, str):
        raise InvalidRequestError(f"runners.processes: cannot tell where {agent!r} is defined")
    module = sys.modules.get(module_name) or importlib.import_module(module_name)
    if target is not agent:
        names = [name for name, value in vars(module).items() if value is agent]
        if not names:
            raise InvalidRequestError(
                f"runners.processes: the agent instance {agent!r} is not a module-level name of "
                f"{module_name!r}; assign it to one, or pass its class"
            )
        qualname = names[0]
    elif "<" in qualname or attribute_at(module, qualname) is not agent:
        raise InvalidRequestError(
            f"runners.processes: {qualname!r} in {module_name!r} can't be imported by name (a lambda, a "
            "nested function or a rebound name); define the agent at module level"
        )
    if module_name == "__main__":
        path = getattr(module, "__file__", None)
        if not path:
            raise InvalidRequestError(
                "runners.processes: the agent is defined in an interactive session; move it to a module"
            )
        return f"{Path(path).resolve()}:{qualname}"
    return f"{module_name}:{qualname}"


@dataclass(frozen=True)
class RunnerProcessSettings:
    """What every child needs: where the store and gateway are, their secrets, and how to run."""

    agent: str
    store_url: str
    store_token: str
    gateway_url: str
    gateway_secret: str
    concurrency: int
    model: str
    timeout_s: float | None
    log_dir: Path
    nice: int = 0
    """Added to the children's niceness: a lower CPU priority than the trainer's process."""


class RunnerProcesses:
    """Start, watch and stop `count` `reinforge runner` children (killed by PID, never by name)."""

    def __init__(self, settings: RunnerProcessSettings, count: int, id_prefix: str) -> None:
        self.settings = settings
        self.count = count
        self.id_prefix = id_prefix
        self._procs: list[subprocess.Popen[bytes]] = []
        self._logs: list[IO[bytes]] = []
        self._stopping = False

    def log_path(self, index: int) -> Path:
        return self.settings.log_dir / f"runner-{index}.log"

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def start(self) -> None:
        s = self.settings
        s.log_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            # Secrets by environment, never argv (which any local user can read).
            "REINFORGE_GATEWAY_SECRET": s.gateway_secret,
            "REINFORGE_STORE_TOKEN": s.store_token,
            # The child imports the agent from wherever this process found it.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        env.setdefault("OMP_NUM_THREADS", "1")  # agents rarely need intra-op threads; cores are few
        for i in range(self.count):
            argv = [
                sys.executable,
                "-m",
                "reinforge",
                "runner",
                "--store",
                s.store_url,
                "--gateway",
                s.gateway_url,
                "--agent",
                s.agent,
                "--concurrency",
                str(s.concurrency),
                "--runner-id",
                f"{self.id_prefix}-{i}",
                "--model",
                s.model,
                "--exit-with-parent",
                str(os.getpid()),
            ]
            if s.timeout_s is not None:
                argv += ["--timeout", str(s.timeout_s)]
            log = open(self.log_path(i), "ab")  # noqa: SIM115 (closed in stop())
            self._logs.append(log)
            self._procs.append(
                subprocess.Popen(
                    argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
                )
            )
            if s.nice:
                pid, base = self._procs[-1].pid, os.getpriority(os.PRIO_PROCESS, 0)
                os.setpriority(os.PRIO_PROCESS, pid, min(base + s.nice, 19))

    def check(self) -> None:
        """Raise RuntimeError, with the end of its log, when a child exited while it should be running."""
        if self._stopping:
            return
        for i, proc in enumerate(self._procs):
            code = proc.poll()
            if code is not None:
                raise RuntimeError(
                    f"runner process {i} (pid {proc.pid}) exited with code {code}; the end of "
                    f"{self.log_path(i)}:\n{self._log_tail(i)}"
                )

    def _log_tail(self, index: int) -> str:
        try:
            text = self.log_path(index).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL_CHARS:].strip() or "(empty log)"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (stop leasing, finish what runs), then SIGKILL whatever is left after `grace_s`."""
        self._stopping = True
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()
        self._logs.clear()
