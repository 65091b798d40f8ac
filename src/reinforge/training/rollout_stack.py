"""`RolloutStack`: everything that turns enqueued rollouts into recorded spans during a training run:
the store server with the gateway mounted, the engine behind the gateway (the embedded one, or a vLLM
/ SGLang server: `engine.backend`), and the runners (in this process, or `reinforge runner`
children: see `runner_processes.py`).

Agents reach the policy only through the gateway over HTTP (as any external agent would), the gateway
records every call into the store, and runners lease rollouts from the same store. The trainer talks
to the store and publishes new weights to the engine between steps, with the gateway paused so that
no call straddles two policy versions.

The stack also keeps its own processes alive: a runner child that dies is restarted after a back-off
and the attempts it was running are failed (retryably) at once, so they run again instead of waiting
out their leases; an engine child that dies is replaced, serving the last published weights, and the
calls it was answering fail with HTTP 503, which the agents' clients retry. Only a crash loop stops the
run (`check_runners` raises it). `processes.json` in the run folder names every process's PID.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import sys
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import TypeVar

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.engine.process import EngineProcess
from reinforge.errors import InvalidRequestError, NotFoundError, StaleAttemptError
from reinforge.runner import Agent, AgentFunction, CommandAgent, Runner
from reinforge.runner.ray_runners import RayRunners, RayRunnerSettings
from reinforge.stack.app import GATEWAY_MOUNT, ServedStack, StackApp
from reinforge.stack.backends import build_serving
from reinforge.stack.join import load_or_create_gateway_secret, runner_join_command, url_for_others
from reinforge.stack.settings import EngineSettings
from reinforge.stack.weight_sync import WeightSync, switch_with_retries
from reinforge.store.http.auth import load_or_create_token
from reinforge.store.protocol import Store
from reinforge.training.config import RunnerSettings, ServeSettings
from reinforge.training.policy import Policy
from reinforge.training.runner_processes import (
    ChildDeath,
    RunnerProcesses,
    RunnerProcessSettings,
    RunnerRestartPolicy,
    agent_reference,
)
from reinforge.types import MAX_PAGE_SIZE, AttemptOutcome, AttemptQuery, AttemptStatus

log = logging.getLogger(__name__)

T = TypeVar("T")

PROCESSES_FILE = "processes.json"
"""In the run folder while the stack runs: {"trainer": pid, "engine": pid | null, "runners": [pid, ...]}."""
_SUPERVISE_EVERY_S = 0.25
_DEAD_RUNNER_WATCH_S = 15.0
"""How long a dead child's runner id is still watched: a lease it sent before dying may be waiting
in the store (a long poll) and hand it rollouts after its death, which would then sit out their
leases."""


class RolloutStack:
    """Start with `await RolloutStack(...).start(agent, runners)`; stop with `await stack.stop()`.

    `model` becomes the embedded engine's: give it a copy the trainer does not update in place. With
    an upstream server (`engine.backend` "vllm" / "sglang") only its config is read.
    """

    def __init__(
        self,
        store: Store,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        run_dir: Path,
        engine: EngineSettings,
        *,
        policy_version: int = 0,
        seed: int | None = None,
        serve: ServeSettings | None = None,
    ) -> None:
        self.store = store
        self.run_dir = run_dir
        self.serve = serve
        self.settings = engine
        self.serving = build_serving(engine, model, tokenizer, policy_version=policy_version, seed=seed)
        self.engine = self.serving.engine
        self.backend = self.serving.backend
        if self.serving.weight_sync is None:
            raise InvalidRequestError(
                f"engine.backend = {engine.backend!r} can't take the trained weights (an upstream server "
                "needs engine.weights_dir)"
            )
        self.weight_sync: WeightSync = self.serving.weight_sync
        self.model_name = engine.model_name
        # Served for outside runners: the secret must be one they can be given (and survive a resume).
        self.served = ServedStack(
            StackApp(
                store,
                self.backend,
                store_token=load_or_create_token(run_dir),
                gateway_secret=load_or_create_gateway_secret(run_dir) if serve is not None else None,
                run_dir=run_dir,
            ),
            host=serve.host if serve is not None else "127.0.0.1",
            port=serve.port if serve is not None else 0,
        )
        self.store_token = self.served.stack.store_token
        self.gateway_secret = self.served.stack.gateway_secret
        self.gateway = self.served.gateway
        self._ray: RayRunners | None = None
        self._ray_watch: asyncio.Task[None] | None = None
        self.join_command: str | None = None
        """The `reinforge runner` command that joins this run (set by `start` when served)."""
        self._runners: list[asyncio.Task[object]] = []
        self._processes: RunnerProcesses | None = None
        self._stop = asyncio.Event()
        self._supervisor: asyncio.Task[None] | None = None
        self._fatal: BaseException | None = None
        self._pids_written: dict[str, object] = {}
        self._dead_runners: dict[str, tuple[ChildDeath, float]] = {}  # runner id -> (death, watch until)
        self.runner_deaths = 0
        """Runner children that died (and were restarted) during this stack's life."""
        self.attempts_released = 0
        """Attempts of dead runner children failed (retryably) so that they run again."""

    @property
    def url(self) -> str:
        return self.served.url

    @property
    def gateway_url(self) -> str:
        return self.served.gateway_url

    @property
    def public_url(self) -> str:
        """The store's URL as runners on other machines reach it."""
        if self.serve is not None and self.serve.public_url:
            return self.serve.public_url.rstrip("/")
        if self.serve is not None:
            return url_for_others(self.serve.host, self.served.server.port)
        return self.url

    @property
    def dashboard_url(self) -> str:
        return self.served.dashboard_url

    async def start(
        self,
        agent: Agent | AgentFunction | CommandAgent,
        runners: RunnerSettings,
        *,
        rollout_timeout_s: float | None = None,
    ) -> RolloutStack:
        """Serve, then run `agent`: `runners.count` runners in this process, or, with
        `runners.processes` > 0, that many `reinforge runner` children instead (each running up to
        `runners.concurrency` attempts, at `runners.processes_nice` lower CPU priority)."""
        # Refuse an agent the children could not import before starting anything.
        reference = agent_reference(agent) if runners.processes > 0 else None
        ray_agent = _ray_agent(agent) if runners.ray is not None else None
        await self.serving.start()
        await self.served.start()
        url_file = self.run_dir / "store.url"
        tmp = url_file.with_suffix(".tmp")
        tmp.write_text(self.url + "\n", encoding="utf-8")
        os.replace(tmp, url_file)
        self._supervisor = asyncio.create_task(self._supervise(), name="rollout-stack-supervisor")
        if self.serve is not None:
            self.join_command = runner_join_command(
                self.public_url,
                self.run_dir,
                _runner_args(agent, runners, rollout_timeout_s, self.model_name),
            )
            print(f"reinforge: runners join this run with\n  {self.join_command}", file=sys.stderr)
        if runners.ray is not None:
            assert ray_agent is not None
            await self._start_ray(ray_agent, runners, rollout_timeout_s)
            return self
        if reference is not None:
            self._processes = RunnerProcesses(
                RunnerProcessSettings.for_stack(
                    self.served,
                    reference,
                    concurrency=runners.concurrency,
                    model=self.model_name,
                    timeout_s=rollout_timeout_s,
                    log_dir=self.run_dir / "logs",
                    nice=runners.processes_nice,
                ),
                runners.processes,
                id_prefix="trainer-process",
                restarts=RunnerRestartPolicy(
                    crash_loop_deaths=runners.crash_loop_deaths,
                    crash_loop_window_s=runners.crash_loop_window_s,
                ),
            )
            self._processes.start()
            self._write_pids()
            return self
        for i in range(runners.count):
            runner = Runner(
                self.store,
                agent,
                self.gateway_url,
                self.gateway_secret,
                concurrency=runners.concurrency,
                runner_id=f"trainer-runner-{i}",
                timeout_s=rollout_timeout_s,
                poll_seconds=1.0,
                model=self.model_name,
                drain_timeout_s=5.0,
                on_lease=self.served.stack.leased,
            )
            self._runners.append(asyncio.create_task(runner.run(stop=self._stop), name=f"runner-{i}"))
        self._write_pids()
        return self

    async def _start_ray(
        self, agent: dict[str, str], runners: RunnerSettings, rollout_timeout_s: float | None
    ) -> None:
        """Runner actors on the Ray cluster (`runners.ray`), watched by `_watch_ray`."""
        assert runners.ray is not None
        settings = RayRunnerSettings.model_validate(
            {
                **agent,
                "store_url": self.public_url,
                "store_token": self.store_token,
                "gateway_url": self.public_url + GATEWAY_MOUNT,
                "gateway_secret": self.gateway_secret,
                "concurrency": runners.concurrency,
                "model": self.model_name,
                "timeout_s": rollout_timeout_s,
                "python_path": [os.getcwd(), *(p for p in sys.path if p)],
            }
        )
        self._ray = RayRunners(
            settings,
            runners.ray.actors,
            address=runners.ray.address,
            cpus_per_actor=runners.ray.cpus_per_actor,
            id_prefix="trainer-ray",
        )
        await asyncio.to_thread(self._ray.start)
        self._ray_watch = asyncio.create_task(self._watch_ray(self._ray), name="ray-runner-watch")

    async def _watch_ray(self, actors: RayRunners) -> None:
        """Replace dead actors (their attempts retry through their leases); a failure that replacing
        can't mend is kept for `check_runners`."""
        while not self._stop.is_set():
            await asyncio.sleep(_SUPERVISE_EVERY_S)
            try:
                await asyncio.to_thread(actors.check)
            except Exception as exc:
                self._fatal = exc
                return

    async def _supervise(self) -> None:
        """Restart dead children and retry their attempts; a crash loop is kept for `check_runners`."""
        while not self._stop.is_set():
            await asyncio.sleep(_SUPERVISE_EVERY_S)
            try:
                deaths = self._processes.poll() if self._processes is not None else []
                loop = asyncio.get_running_loop()
                for death in deaths:
                    self.runner_deaths += 1
                    log.warning("%s; restarting it in %.1f s", death.describe(), death.restart_in_s)
                    self._dead_runners[death.runner_id] = (death, loop.time() + _DEAD_RUNNER_WATCH_S)
                for runner_id, (death, until) in list(self._dead_runners.items()):
                    await self._release(death)
                    if loop.time() > until:
                        del self._dead_runners[runner_id]
                failure = self.engine.failure if isinstance(self.engine, EngineProcess) else None
                if failure is not None:
                    raise RuntimeError(f"the engine process can't serve any more: {failure}")
                self._write_pids()
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # kept for the trainer, which stops the run with it
                self._fatal = exc
                return

    async def _release(self, death: ChildDeath) -> None:
        """Fail the dead child's running attempts now, retryably: their rollouts go back to the queue
        (or end failed when out of attempts) instead of waiting for the leases to run out."""
        outcome = AttemptOutcome(
            status=AttemptStatus.failed,
            error=f"{death.describe()} while running this attempt (retried if the rollout has attempts left)",
            retryable=True,
        )
        query = AttemptQuery(runner_id=death.runner_id, statuses=[AttemptStatus.running], limit=MAX_PAGE_SIZE)
        while True:
            page = await self.store.query_attempts(query)
            for attempt in page.items:
                with contextlib.suppress(StaleAttemptError, NotFoundError):  # ended meanwhile
                    await self.gateway.finish_attempt(attempt.attempt_id, outcome)
                    self.attempts_released += 1
            if page.next_offset is None or not page.items:
                return

    def _write_pids(self) -> None:
        """`processes.json`: what an operator (or a chaos test) signals, by PID, never by name."""
        engine_pid = self.engine.pid if isinstance(self.engine, EngineProcess) else None
        pids: dict[str, object] = {"trainer": os.getpid(), "engine": engine_pid, "runners": self.runner_pids}
        if pids == self._pids_written:
            return
        path = self.run_dir / PROCESSES_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(pids) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        self._pids_written = pids

    @property
    def runner_pids(self) -> list[int]:
        """The runner children's process ids (none when the runners run in this process)."""
        return self._processes.pids if self._processes is not None else []

    def check_runners(self) -> None:
        """Raise a crash loop (of a runner child or the engine) or an in-process runner's crash here,
        in the trainer, instead of waiting for rollouts that never come."""
        if self._fatal is not None:
            raise RuntimeError(f"the run stops: {self._fatal}") from self._fatal
        for task in self._runners:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"runner {task.get_name()} crashed") from task.exception()

    async def watch(self, work: Awaitable[T], every_s: float = 0.5) -> T:
        """Await `work`, but fail as soon as a runner dies (its rollouts would never finish)."""
        task = asyncio.ensure_future(work)
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            try:
                self.check_runners()
            except BaseException:
                task.cancel()
                with contextlib.suppress(BaseException):
                    await task
                raise

    def hold(self, rollout_ids: Sequence[str], version: int) -> None:
        """The LLM calls of these rollouts (not enqueued yet) will wait at the gateway until policy
        `version` is published: their agents can start early, their tokens are still sampled by
        the policy they are trained against."""
        self.gateway.hold_rollouts(rollout_ids, version)

    def drop_holds(self, rollout_ids: Sequence[str]) -> None:
        """The held rollouts were cancelled: their waiting calls fail instead of waiting on."""
        self.gateway.drop_holds(rollout_ids)

    def release_engine_cache(self) -> None:
        """An update is about to run: the embedded engine frees its KV cache once its calls are done
        (`Engine.release_cache`), so the update does not hold its memory beside the cache."""
        if self.engine is not None:
            self.engine.release_cache()

    async def publish(self, policy: Policy, version: int) -> None:
        """Serve `policy` as `version`: its weights are staged (written where the server reads them)
        while calls still run, then new calls wait and in-flight ones drain, the backend switches,
        and calls held for this version go through. A failed switch (retried as `engine.
        on_sync_failure` says) raises WeightSyncError with the old version still serving."""
        staged = await self.weight_sync.stage(policy, version)
        retries = self.settings.sync_retries if self.settings.on_sync_failure == "retry" else 0
        await self.gateway.pause()
        try:
            await switch_with_retries(
                self.weight_sync, staged, retries=retries, delay_s=self.settings.sync_retry_delay_s
            )
            self.gateway.release_version(version)
        finally:
            self.gateway.resume()
        # The released calls reach the engine before the trainer moves on to the next step's work.
        await self.gateway.settle()

    async def stop(self) -> None:
        self._stop.set()
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(BaseException):
                await self._supervisor
        if self._processes is not None:
            await asyncio.to_thread(self._processes.stop)
        if self._ray is not None:
            if self._ray_watch is not None:
                self._ray_watch.cancel()
                with contextlib.suppress(BaseException):
                    await self._ray_watch
            await asyncio.to_thread(self._ray.stop)
        if self._runners:
            await asyncio.wait(self._runners, timeout=30)
        for task in self._runners:
            task.cancel()
        with contextlib.suppress(Exception):  # the server stops even when the last flush fails
            await self.served.stop()
        await self.serving.aclose()
        (self.run_dir / "store.url").unlink(missing_ok=True)
        (self.run_dir / PROCESSES_FILE).unlink(missing_ok=True)


def _ray_agent(agent: Agent | AgentFunction | CommandAgent) -> dict[str, str]:
    """How Ray actors find `agent`: its command, or its `module:attribute` reference."""
    if isinstance(agent, CommandAgent):
        if agent.cwd is not None or agent.extra_env:
            raise InvalidRequestError(
                "runners.ray runs a command agent from its command line alone; its cwd and env would be "
                "lost (set them in the command, e.g. `sh -c 'cd DIR && ...'`)"
            )
        return {"agent_cmd": shlex.join(agent.argv), "pass_env": list(agent.pass_env)}  # type: ignore[dict-item]
    return {"agent": agent_reference(agent)}


def _runner_args(
    agent: Agent | AgentFunction | CommandAgent,
    runners: RunnerSettings,
    rollout_timeout_s: float | None,
    model_name: str,
) -> list[str]:
    """The `reinforge runner` options that run `agent` as this run's own runners do."""
    if isinstance(agent, CommandAgent):
        args = ["--agent-cmd", shlex.join(agent.argv)]
        args += [a for name in agent.pass_env for a in ("--pass-env", name)]
    else:
        try:
            args = ["--agent", agent_reference(agent)]
        except InvalidRequestError:  # a lambda or nested function: nobody can import it by name
            args = ["--agent", "MODULE:FUNCTION"]
    args += ["--concurrency", str(runners.concurrency), "--model", model_name]
    if rollout_timeout_s is not None:
        args += ["--timeout", str(rollout_timeout_s)]
    return args
