"""Runner actors on a Ray cluster: `reinforge runner --ray ADDRESS --num-runners N`, or the trainer's
`runners.ray` setting.

Each actor is one `Runner` in its own Ray worker process, leasing from the store over HTTP and
finishing attempts through the gateway, exactly as a `reinforge runner` on another machine would; Ray
only places, starts and stops them. Nothing depends on an actor staying alive: a killed actor's
leases expire and the store gives those rollouts to another runner as new attempts. The driver
replaces an actor that died after it started (a lost node, an out-of-memory kill, `ray.kill`), and
gives up on one that cannot start at all (a wrong agent name), with the actor's own error.

Secrets travel to the actors as task arguments through Ray's object store, never in argv.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from reinforge.errors import InvalidRequestError, ReinforgeError
from reinforge.runner.runner import DEFAULT_MODEL, RunnerStats
from reinforge.types import RolloutMode

log = logging.getLogger(__name__)

RAY_EXTRA_HINT = "Ray is not installed: pip install 'reinforge[ray]'"


class RayRunnerSettings(BaseModel):
    """What every runner actor needs: where the store and gateway are, their secrets, the agent.

    `agent` is a `module:attribute` reference (imported inside the actor; `python_path` entries that
    exist on the actor's machine are put on its `sys.path` first) and `agent_cmd` a command run per
    attempt; give exactly one. `max_rollouts` bounds each actor, not the actors together.
    """

    model_config = ConfigDict(extra="forbid")

    store_url: str
    store_token: SecretStr | None = None
    gateway_url: str
    gateway_secret: SecretStr
    agent: str | None = None
    agent_cmd: str | None = None
    pass_env: list[str] = Field(default_factory=list)
    concurrency: int = Field(default=1, ge=1)
    model: str = DEFAULT_MODEL
    timeout_s: float | None = Field(default=None, gt=0)
    lease_seconds: float = Field(default=60.0, gt=0)
    mode: RolloutMode | None = None
    max_rollouts: int | None = Field(default=None, ge=1)
    python_path: list[str] = Field(default_factory=list)
    instrument_frameworks: bool = True

    @model_validator(mode="after")
    def _one_agent(self) -> RayRunnerSettings:
        if (self.agent is None) == (self.agent_cmd is None):
            raise ValueError("give exactly one of agent (module:attribute) or agent_cmd")
        return self


class RunnerActor:
    """One runner inside a Ray actor (the class is wrapped with `ray.remote` when actors start, so
    importing this module needs no Ray). Its methods are async: `stop` runs while `run` does."""

    def __init__(self, settings: RayRunnerSettings, runner_id: str) -> None:
        import asyncio

        self.settings = settings
        self.runner_id = runner_id
        self._stop = asyncio.Event()
        self._runner: Any = None
        for entry in reversed(settings.python_path):
            if entry not in sys.path and os.path.isdir(entry):
                sys.path.insert(0, entry)
        # Load the agent now: a wrong reference fails `ready()`, before any rollout is leased.
        from reinforge.runner.agent import load_agent
        from reinforge.runner.command import CommandAgent

        if settings.agent_cmd is not None:
            self.agent: Any = CommandAgent(settings.agent_cmd, settings.timeout_s, pass_env=settings.pass_env)
        else:
            assert settings.agent is not None
            self.agent = load_agent(settings.agent)

    async def ready(self) -> str:
        """Answers once the actor is up and its agent imported."""
        return f"{self.runner_id} (pid {os.getpid()})"

    async def run(self) -> dict[str, Any]:
        """Lease and run rollouts until `stop` (or `max_rollouts`); returns the runner's counts."""
        from reinforge.runner.runner import Runner
        from reinforge.store.factory import open_store

        s = self.settings
        store = await open_store(s.store_url, s.store_token.get_secret_value() if s.store_token else None)
        self._runner = Runner(
            store,
            self.agent,
            s.gateway_url,
            s.gateway_secret.get_secret_value(),
            concurrency=s.concurrency,
            runner_id=self.runner_id,
            mode=s.mode,
            lease_seconds=s.lease_seconds,
            timeout_s=s.timeout_s,
            model=s.model,
            instrument_frameworks=s.instrument_frameworks,
        )
        try:
            stats = await self._runner.run(max_rollouts=s.max_rollouts, stop=self._stop)
        finally:
            await store.close()
        return {
            "runner_id": self.runner_id,
            "leased": stats.leased,
            "succeeded": stats.succeeded,
            "failed": stats.failed,
            "timed_out": stats.timed_out,
            "stopped": stats.stopped,
        }

    async def stop(self, now: bool = False) -> None:
        """Stop leasing and let running attempts finish; with `now`, stop them too (each is failed
        retryably, so the store gives its rollout to another runner)."""
        self._stop.set()
        if now and self._runner is not None:
            self._runner.stop_now()


@dataclass
class _Slot:
    runner_id: str
    actor: Any
    run_ref: Any


@dataclass
class RayRunnerTotals(RunnerStats):
    """The actors' `RunnerStats`, added up over every actor that returned its counts."""

    replaced: int = 0
    """Actors that died mid-run and were replaced."""
    lost: list[str] = field(default_factory=list)
    """Actors that died without returning counts (their attempts retried through their leases)."""

    def add(self, counts: dict[str, Any]) -> None:
        for key in ("leased", "succeeded", "failed", "timed_out", "stopped"):
            setattr(self, key, getattr(self, key) + int(counts.get(key, 0)))


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise InvalidRequestError(RAY_EXTRA_HINT) from e
    return ray


class RayRunners:
    """Start, watch and stop `count` runner actors on the Ray cluster at `address`.

    `address`: "auto", "HOST:PORT" of a head, "ray://HOST:PORT", or "local" (a cluster of this machine
    alone, started here and shut down by `stop`). When this process already joined a cluster
    (`ray.init` was called), that one is used and left running. `max_replacements` bounds how many
    dead actors are replaced before `check` gives up.
    """

    def __init__(
        self,
        settings: RayRunnerSettings,
        count: int,
        *,
        address: str = "auto",
        cpus_per_actor: float = 1.0,
        id_prefix: str = "ray-runner",
        max_replacements: int = 16,
        start_timeout_s: float = 300.0,
    ) -> None:
        if count < 1:
            raise InvalidRequestError(f"the number of Ray runners must be at least 1, got {count}")
        self.settings = settings
        self.count = count
        self.address = address
        self.cpus_per_actor = cpus_per_actor
        self.id_prefix = id_prefix
        self.max_replacements = max_replacements
        self.start_timeout_s = start_timeout_s
        self.totals = RayRunnerTotals()
        self._slots: list[_Slot] = []
        self._started_ray = False
        self._stopping = False
        self._next_id = 0

    @property
    def actors(self) -> list[Any]:
        """The live actors' handles, in slot order (tests kill one with `ray.kill`)."""
        return [slot.actor for slot in self._slots]

    @property
    def runner_ids(self) -> list[str]:
        return [slot.runner_id for slot in self._slots]

    def start(self) -> RayRunners:
        """Join the cluster, start the actors and wait until each has imported its agent."""
        ray = _ray()
        if not ray.is_initialized():
            try:
                ray.init(address=self.address, namespace="reinforge", logging_level=logging.WARNING)
            except ConnectionError as e:
                raise InvalidRequestError(f"cannot join the Ray cluster at {self.address!r}: {e}") from e
            self._started_ray = True
        slots = [self._new_slot() for _ in range(self.count)]
        try:
            self._wait_ready(slots)
        except BaseException:
            for slot in slots:
                ray.kill(slot.actor, no_restart=True)
            raise
        for slot in slots:
            slot.run_ref = slot.actor.run.remote()
        self._slots = slots
        return self

    def _new_slot(self) -> _Slot:
        ray = _ray()
        runner_id = f"{self.id_prefix}-{self._next_id}"
        self._next_id += 1
        actor_class = ray.remote(RunnerActor).options(
            num_cpus=self.cpus_per_actor, max_restarts=0, max_task_retries=0
        )
        return _Slot(runner_id, actor_class.remote(self.settings, runner_id), None)

    def _wait_ready(self, slots: list[_Slot]) -> None:
        ray = _ray()
        refs = [slot.actor.ready.remote() for slot in slots]
        _, pending = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout_s)
        if pending:
            raise ReinforgeError(
                f"{len(pending)} Ray runner actor(s) did not start within {self.start_timeout_s}s "
                "(does the cluster have the CPUs? see runners.ray.cpus_per_actor)"
            )
        for ref, slot in zip(refs, slots, strict=True):
            try:
                ray.get(ref)
            except Exception as e:  # the actor's own error (an agent that can't be imported, ...)
                raise ReinforgeError(f"Ray runner actor {slot.runner_id} could not start: {_cause(e)}") from e

    def check(self) -> None:
        """Replace actors that died mid-run (their leases expire and their rollouts retry); raise
        when an actor's runner failed, or when more than `max_replacements` died."""
        if self._stopping:
            return
        ray = _ray()
        for index, slot in enumerate(self._slots):
            done, _ = ray.wait([slot.run_ref], timeout=0)
            if not done:
                continue
            try:
                self.totals.add(ray.get(slot.run_ref))
                raise ReinforgeError(f"Ray runner actor {slot.runner_id} stopped while it should run")
            except ray.exceptions.RayActorError as e:
                self.totals.lost.append(slot.runner_id)
                if self.totals.replaced >= self.max_replacements:
                    raise ReinforgeError(
                        f"Ray runner actors died {self.totals.replaced + 1} times (the last, "
                        f"{slot.runner_id}: {_cause(e)}); not replacing any more"
                    ) from e
                log.warning(
                    "Ray runner actor %s died (%s); starting a replacement", slot.runner_id, _cause(e)
                )
                replacement = self._new_slot()
                self._wait_ready([replacement])
                replacement.run_ref = replacement.actor.run.remote()
                self._slots[index] = replacement
                self.totals.replaced += 1
            except ray.exceptions.RayTaskError as e:
                raise ReinforgeError(f"Ray runner actor {slot.runner_id} failed: {_cause(e)}") from e

    def finished(self) -> bool:
        """Whether every actor's run has returned (with `max_rollouts`, each ran its share)."""
        ray = _ray()
        refs = [slot.run_ref for slot in self._slots]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0)
        return len(done) == len(refs)

    def stop(self, grace_s: float = 10.0, *, now: bool = False) -> RayRunnerTotals:
        """Stop every actor (as `RunnerActor.stop`), wait up to `grace_s` for their counts, kill
        whatever is left; leave the cluster when this object joined it."""
        self._stopping = True
        ray = _ray()
        try:
            for slot in self._slots:
                with contextlib.suppress(ray.exceptions.RayActorError):
                    slot.actor.stop.remote(now)
            refs = [slot.run_ref for slot in self._slots]
            done, _ = ray.wait(refs, num_returns=len(refs), timeout=grace_s)
            done_set = set(done)
            for slot in self._slots:
                if slot.run_ref in done_set:
                    try:
                        self.totals.add(ray.get(slot.run_ref))
                    except (ray.exceptions.RayActorError, ray.exceptions.RayTaskError):
                        self.totals.lost.append(slot.runner_id)
                else:
                    self.totals.lost.append(slot.runner_id)
                ray.kill(slot.actor, no_restart=True)
            self._slots = []
        finally:
            if self._started_ray:
                ray.shutdown()
                self._started_ray = False
        return self.totals


def _cause(exc: BaseException) -> str:
    """The useful line of a Ray error (its text repeats the remote traceback)."""
    text = str(exc).strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1][:500] if lines else type(exc).__name__
