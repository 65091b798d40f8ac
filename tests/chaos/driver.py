"""The chaos driver: runs `reinforge train` on a small calc config and SIGKILLs its processes.

Kills go by PID only: the trainer's PID is the subprocess this driver started; the engine's and the
runner children's come from the run folder's `processes.json` (written by the rollout stack) and are
checked against `/proc/<pid>` (parent and command line) before each kill, so a recycled PID is never
signalled. Before each kill the driver reads every span the store has acknowledged, so the end of the
run can check that none was lost.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from reinforge.store.http.client import HttpStoreClient
from reinforge.types import MAX_PAGE_SIZE, SpanQuery

CONFIG = """\
[model]
path = "builtin:calc-warm-start"

[agent]
entry = "reinforge.demo.agent:calc_agent"
timeout_s = 60

[data]
train = "reinforge.demo.tasks:train_tasks"

[algorithm]
name = "grpo"
group_size = 4

[credit]
mode = "merged"
assignment = "equal+air"
include_failed = false     # a rollout cut off by a kill is not the agent's failure: never trained on

[trainer]
run_dir = "run"
seed = {seed}
progress = false

[trainer.rollouts]
tasks_per_step = 4
max_tokens = 48
step_timeout_s = 240

[trainer.runners]
concurrency = 16
processes = 2
crash_loop_deaths = 4

[trainer.engine]
max_batch_size = 32
process = true

[trainer.schedule]
max_steps = {max_steps}
val_every = 0

[trainer.checkpoints]
every = 2
"""


@dataclass
class ChaosReport:
    """What the driver did and saw."""

    kills: dict[str, int] = field(default_factory=lambda: {"runner": 0, "engine": 0, "trainer": 0})
    restarts_seen: dict[str, int] = field(default_factory=lambda: {"runner": 0, "engine": 0})
    acknowledged_spans: set[str] = field(default_factory=set)
    sessions: int = 0
    exit_codes: list[int] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


class ChaosDriver:
    """One run folder, one `reinforge train` command, started (and started again) by this driver."""

    def __init__(self, work_dir: Path, *, seed: int, max_steps: int) -> None:
        self.work_dir = work_dir
        self.run_dir = work_dir / "run"
        self.config = work_dir / "config.toml"
        self.config.write_text(CONFIG.format(seed=seed, max_steps=max_steps), encoding="utf-8")
        self.max_steps = max_steps
        self.rng = random.Random(seed)
        self.report = ChaosReport()
        self.trainer: subprocess.Popen[bytes] | None = None
        self._known_children: set[int] = set()
        self._started = time.monotonic()

    # -- the trainer -----------------------------------------------------------------------------

    def start(self) -> None:
        """`reinforge train config.toml` (the same command every time: it resumes from the run folder)."""
        self.report.sessions += 1
        (self.run_dir / "processes.json").unlink(missing_ok=True)
        log = (self.work_dir / f"trainer-{self.report.sessions}.log").open("wb")
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.trainer = subprocess.Popen(
            [sys.executable, "-m", "reinforge", "train", str(self.config)],
            cwd=self.work_dir,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
        )
        log.close()
        self.note(f"session {self.report.sessions}: trainer pid {self.trainer.pid}")

    def wait_trainer(self, timeout_s: float) -> int:
        assert self.trainer is not None
        code = self.trainer.wait(timeout_s)
        self.report.exit_codes.append(code)
        return code

    def trainer_log(self) -> str:
        return (self.work_dir / f"trainer-{self.report.sessions}.log").read_text(errors="replace")[-4000:]

    # -- what the run folder says ----------------------------------------------------------------

    def steps_done(self) -> int:
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return 0
        steps = [0]
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if "train/reward" in record:
                steps.append(int(record["step"]))
        return max(steps)

    def processes(self) -> dict[str, object]:
        try:
            value = json.loads((self.run_dir / "processes.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        assert self.trainer is not None
        if value.get("trainer") != self.trainer.pid:
            return {}  # a file left by an earlier session
        return dict(value)

    def runner_pids(self) -> list[int]:
        pids = self.processes().get("runners") or []
        assert isinstance(pids, list)
        return [int(p) for p in pids]

    def engine_pid(self) -> int | None:
        pid = self.processes().get("engine")
        return int(pid) if isinstance(pid, int) else None

    def wait_until(self, what: str, ready: object, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.trainer is not None
            if self.trainer.poll() is not None:
                code = self.trainer.returncode
                raise AssertionError(f"the trainer exited ({code}) waiting for {what}:\n{self.trainer_log()}")
            if callable(ready) and ready():
                return
            time.sleep(0.1)
        raise AssertionError(f"timed out waiting for {what}:\n{self.trainer_log()}")

    # -- kills -----------------------------------------------------------------------------------

    def _is_child_of_trainer(self, pid: int) -> bool:
        """`pid` is alive, a child of our trainer, and a Python process (never a recycled PID)."""
        assert self.trainer is not None
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        return parent == self.trainer.pid and b"reinforge" in cmdline

    def kill_runner(self) -> int:
        pids = [p for p in self.runner_pids() if self._is_child_of_trainer(p)]
        assert pids, "no runner child to kill"
        victim = self.rng.choice(pids)
        self._known_children.update(pids)
        os.kill(victim, signal.SIGKILL)
        self.report.kills["runner"] += 1
        self.note(f"SIGKILL runner child {victim}")
        self.wait_until(
            "a restarted runner child",
            lambda: victim not in self.runner_pids() and len(self.runner_pids()) == 2,
            120,
        )
        self.report.restarts_seen["runner"] += 1
        self.note(f"runner children now {self.runner_pids()}")
        return victim

    def kill_engine(self) -> int:
        victim = self.engine_pid()
        assert victim is not None and self._is_child_of_trainer(victim), "no engine child to kill"
        self._known_children.add(victim)
        os.kill(victim, signal.SIGKILL)
        self.report.kills["engine"] += 1
        self.note(f"SIGKILL engine child {victim}")
        self.wait_until("a replaced engine child", lambda: self.engine_pid() not in (None, victim), 180)
        self.report.restarts_seen["engine"] += 1
        self.note(f"engine child now {self.engine_pid()}")
        return victim

    def kill_trainer(self) -> None:
        assert self.trainer is not None
        self._known_children.update(self.runner_pids())
        engine = self.engine_pid()
        if engine is not None:
            self._known_children.add(engine)
        os.kill(self.trainer.pid, signal.SIGKILL)
        self.report.kills["trainer"] += 1
        self.note(f"SIGKILL trainer {self.trainer.pid} at step {self.steps_done()}")
        self.wait_trainer(30)
        self.wait_children_gone(60)

    def wait_children_gone(self, timeout_s: float) -> None:
        """The trainer's children leave with it (they watch their parent / their pipe)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            alive = [p for p in self._known_children if _alive(p)]
            if not alive:
                return
            time.sleep(0.2)
        raise AssertionError(f"children {alive} outlived their killed trainer")

    def pause(self, low_s: float, high_s: float) -> None:
        """A seeded-random moment: somewhere in a step's collect, update or publish."""
        time.sleep(self.rng.uniform(low_s, high_s))

    # -- acknowledged spans ----------------------------------------------------------------------

    def snapshot_spans(self) -> int:
        """Every span id the store has acknowledged right now (read through its own server)."""
        url = (self.run_dir / "store.url").read_text(encoding="utf-8").strip()
        token = (self.run_dir / "store.token").read_text(encoding="utf-8").strip()
        ids = asyncio.run(_all_span_ids(url, token))
        self.report.acknowledged_spans |= ids
        return len(ids)

    def note(self, text: str) -> None:
        self.report.events.append(f"{time.monotonic() - self._started:7.1f}s {text}")

    def cleanup(self) -> None:
        """Leave nothing running: the trainer and any child this driver has seen (by PID)."""
        if self.trainer is not None and self.trainer.poll() is None:
            self._known_children.update(self.runner_pids())
            self.trainer.kill()
            self.trainer.wait()
        for pid in self._known_children:
            if _alive(pid):
                try:
                    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                except OSError:
                    continue
                if b"reinforge" in cmdline:
                    os.kill(pid, signal.SIGKILL)


async def _all_span_ids(url: str, token: str) -> set[str]:
    client = HttpStoreClient(url, token)
    ids: set[str] = set()
    try:
        offset: int | None = 0
        while offset is not None:
            page = await client.query_spans(SpanQuery(limit=MAX_PAGE_SIZE, offset=offset))
            ids.update(s.span_id for s in page.items)
            offset = page.next_offset
    finally:
        await client.close()
    return ids


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
