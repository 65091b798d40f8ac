"""Runner processes for a training run: the agents' Python on cores of its own.

In-process agents share one interpreter lock with the gateway, the store and the engine's scheduler,
so their own Python (an OpenAI SDK call is milliseconds of it) serialises every step. With
`TrainerConfig.runners.processes = N` the trainer starts N `reinforge runner` children instead: each
leases from the trainer's store over HTTP and sends its agents' calls to the same gateway, exactly as
a runner on another machine would, and the trainer's process keeps only the serving and learning.

A child that dies is started again after a back-off (`RunnerRestartPolicy`), and the attempts it was running
are retried through the store; only a crash loop (the same child dying again and again within a short
window) stops the run, with the end of the child's log in the error.

A child imports the agent by reference, so the agent must be reachable by name: a module-level
function (decorated or not), `Agent` subclass or instance, in an importable module or in the script
being run.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from reinforge.errors import InvalidRequestError
from reinforge.restarts import DeathWindow, RestartPolicy
from reinforge.runner.agent import Agent, attribute_at
from reinforge.runner.command import CommandAgent

if TYPE_CHECKING:
    from reinforge.stack.app import ServedStack

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

    @classmethod
    def for_stack(
        cls,
        served: ServedStack,
        agent: str,
        *,
        concurrency: int,
        model: str,
        timeout_s: float | None,
        log_dir: Path,
        nice: int = 0,
    ) -> RunnerProcessSettings:
        """Children of the stack `served` in this process: its URLs and secrets, and how to run."""
        return cls(
            agent=agent,
            store_url=served.url,
            store_token=served.stack.store_token,
            gateway_url=served.gateway_url,
            gateway_secret=served.stack.gateway_secret,
            concurrency=concurrency,
            model=model,
            timeout_s=timeout_s,
            log_dir=log_dir,
            nice=nice,
        )


class RunnerCrashLoopError(RuntimeError):
    """A runner child died `deaths` times within the crash-loop window: restarting it again would
    only repeat the failure (an agent that crashes on import, a missing dependency), so the run stops."""


@dataclass(frozen=True)
class RunnerRestartPolicy(RestartPolicy):
    """How dead runner children come back.

    A death schedules a restart after `backoff_s`, doubled for each earlier death still inside the
    window (up to `max_backoff_s`): one lost process costs a second, a flapping one does not spin.
    `crash_loop_deaths` deaths of one child within `crash_loop_window_s` stop the run instead.
    """


@dataclass(frozen=True)
class ChildDeath:
    """One runner child that exited while it should have been running."""

    index: int
    pid: int
    exit_code: int
    runner_id: str
    """The id it leased under: its attempts still running in the store are the ones it lost."""
    restart_in_s: float

    def describe(self) -> str:
        how = f"killed by signal {-self.exit_code}" if self.exit_code < 0 else f"exit code {self.exit_code}"
        return f"runner process {self.index} (pid {self.pid}, runner id {self.runner_id!r}) died ({how})"


@dataclass
class _Child:
    index: int
    incarnation: int = 0
    proc: subprocess.Popen[bytes] | None = None
    deaths: DeathWindow = field(default_factory=DeathWindow)
    restart_at: float | None = None
    runner_id: str = ""


class RunnerProcesses:
    """Start, watch, restart and stop `count` `reinforge runner` children (by PID, never by name).

    `poll()` (the owner calls it every fraction of a second) reports the children that died since
    the last call and starts the ones whose back-off has passed. A restarted child leases under a
    new runner id (`<prefix>-<index>.<incarnation>`), so the attempts the dead one left running are
    told apart from the new one's: the owner fails them in the store (retryably) and they run again.
    """

    def __init__(
        self,
        settings: RunnerProcessSettings,
        count: int,
        id_prefix: str,
        restarts: RunnerRestartPolicy | None = None,
    ) -> None:
        self.settings = settings
        self.count = count
        self.id_prefix = id_prefix
        self.restarts = restarts or RunnerRestartPolicy()
        self._children = [_Child(index=i) for i in range(count)]
        self._logs: dict[int, IO[bytes]] = {}
        self._stopping = False
        self.restarted = 0
        """Children started again after a death, over the run."""

    def log_path(self, index: int) -> Path:
        return self.settings.log_dir / f"runner-{index}.log"

    @property
    def pids(self) -> list[int]:
        """The children's process ids (a child waiting out its back-off after a death has none)."""
        return [c.proc.pid for c in self._children if c.proc is not None]

    def runner_id(self, index: int) -> str:
        """The id child `index` leases under now."""
        return self._children[index].runner_id

    def start(self) -> None:
        self.settings.log_dir.mkdir(parents=True, exist_ok=True)
        for child in self._children:
            self._spawn(child)

    def _spawn(self, child: _Child) -> None:
        s = self.settings
        env = {
            **os.environ,
            # Secrets by environment, never argv (which any local user can read).
            "REINFORGE_GATEWAY_SECRET": s.gateway_secret,
            "REINFORGE_STORE_TOKEN": s.store_token,
            # The child imports the agent from wherever this process found it.
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
        }
        env.setdefault("OMP_NUM_THREADS", "1")  # agents rarely need intra-op threads; cores are few
        child.runner_id = f"{self.id_prefix}-{child.index}" + (
            f".{child.incarnation}" if child.incarnation else ""
        )
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
            child.runner_id,
            "--model",
            s.model,
            "--exit-with-parent",
            str(os.getpid()),
        ]
        if s.timeout_s is not None:
            argv += ["--timeout", str(s.timeout_s)]
        log = self._logs.get(child.index)
        if log is None:
            log = self._logs[child.index] = open(self.log_path(child.index), "ab")  # noqa: SIM115 (closed in stop())
        if child.incarnation:
            log.write(f"\n--- restarted as {child.runner_id} ---\n".encode())
            log.flush()
        child.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
        child.restart_at = None
        if s.nice:
            base = os.getpriority(os.PRIO_PROCESS, 0)
            with contextlib.suppress(ProcessLookupError):  # it may already have died
                os.setpriority(os.PRIO_PROCESS, child.proc.pid, min(base + s.nice, 19))

    def poll(self, now: float | None = None) -> list[ChildDeath]:
        """The children that died since the last call (each scheduled for a restart), after starting
        those whose back-off has passed.

        Raises RunnerCrashLoopError, quoting the child's log, when one died `crash_loop_deaths` times
        within the window.
        """
        if self._stopping:
            return []
        now = time.monotonic() if now is None else now
        policy = self.restarts
        deaths: list[ChildDeath] = []
        for child in self._children:
            if child.proc is None:
                if child.restart_at is not None and now >= child.restart_at:
                    child.incarnation += 1
                    self.restarted += 1
                    self._spawn(child)
                continue
            code = child.proc.poll()
            if code is None:
                continue
            pid = child.proc.pid
            child.proc = None
            if child.deaths.record(now, code, policy):
                raise RunnerCrashLoopError(
                    f"runner process {child.index} (pid {pid}) died {len(child.deaths)} times within "
                    f"{policy.crash_loop_window_s:.0f} s (last exit code {code}), so it is not restarted "
                    f"again; the end of {self.log_path(child.index)}:\n{self._log_tail(child.index)}"
                )
            delay = policy.delay(len(child.deaths))
            child.restart_at = now + delay
            deaths.append(ChildDeath(child.index, pid, code, child.runner_id, delay))
        return deaths

    def _log_tail(self, index: int) -> str:
        log = self._logs.get(index)
        if log is not None:
            log.flush()
        try:
            text = self.log_path(index).read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return text[-_LOG_TAIL_CHARS:].strip() or "(empty log)"

    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM (stop leasing, finish what runs), then SIGKILL whatever is left after `grace_s`."""
        self._stopping = True
        procs = [c.proc for c in self._children if c.proc is not None]
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs.values():
            log.close()
        self._logs.clear()
