"""`RolloutStack`: everything that turns enqueued rollouts into recorded spans during a training run:
the store server with the gateway mounted, the engine behind the gateway, and the runners (in this
process, or `reinforge runner` children: see `runner_processes.py`).

Agents reach the policy only through the gateway over HTTP (as any external agent would), the gateway
records every call into the store, and runners lease rollouts from the same store. The trainer talks
to the store and publishes new weights to the engine between steps, with the gateway paused so that
no call straddles two policy versions.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
from collections.abc import Awaitable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from reinforge.engine.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.engine.process import EngineProcess
from reinforge.gateway.app import Gateway, create_gateway_app
from reinforge.net.background import BackgroundServer
from reinforge.runner import Agent, AgentFunction, CommandAgent, Runner
from reinforge.store.http.auth import load_or_create_token
from reinforge.store.http.server import create_store_app
from reinforge.store.protocol import Store
from reinforge.training.config import EngineSettings, RunnerSettings
from reinforge.training.runner_processes import RunnerProcesses, RunnerProcessSettings, agent_reference
from reinforge.types import LeasedRollout

T = TypeVar("T")

GATEWAY_MOUNT = "/gateway"
MODEL_NAME = "reinforge-policy"


class RolloutStack:
    """Start with `await RolloutStack(...).start(agent, runners)`; stop with `await stack.stop()`.

    `model` becomes the engine's: give it a copy the trainer does not update in place.
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
    ) -> None:
        self.store = store
        self.run_dir = run_dir
        engine_type: type[Engine] | type[EngineProcess] = EngineProcess if engine.process else Engine
        self.engine: Engine | EngineProcess = engine_type(
            model,
            tokenizer,
            max_batch_size=engine.max_batch_size,
            max_seq_len=engine.max_seq_len,
            retain_prefixes=engine.retain_prefixes,
            policy_version=policy_version,
            seed=seed,
        )
        self.backend = EngineBackend(self.engine, tokenizer, model_name=MODEL_NAME)
        self.store_token = load_or_create_token(run_dir)
        self.gateway_secret = secrets.token_urlsafe(24)
        store_app = create_store_app(store, self.store_token, on_lease=self._leased)
        gateway_app = create_gateway_app(store, self.backend, self.gateway_secret)
        self.gateway: Gateway = gateway_app.state.gateway
        store_app.mount(GATEWAY_MOUNT, gateway_app)
        # Mounted apps get no lifespan events; the gateway binds to the serving loop on first use.
        self.server = BackgroundServer(store_app)
        self._runners: list[asyncio.Task[object]] = []
        self._processes: RunnerProcesses | None = None
        self._stop = asyncio.Event()

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def gateway_url(self) -> str:
        return self.server.url + GATEWAY_MOUNT

    @property
    def dashboard_url(self) -> str:
        return f"{self.server.url}/dashboard#token={self.store_token}"

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
        await asyncio.to_thread(self.engine.start)
        await asyncio.to_thread(self.server.start)
        url_file = self.run_dir / "store.url"
        tmp = url_file.with_suffix(".tmp")
        tmp.write_text(self.url + "\n", encoding="utf-8")
        os.replace(tmp, url_file)
        if reference is not None:
            self._processes = RunnerProcesses(
                RunnerProcessSettings(
                    agent=reference,
                    store_url=self.url,
                    store_token=self.store_token,
                    gateway_url=self.gateway_url,
                    gateway_secret=self.gateway_secret,
                    concurrency=runners.concurrency,
                    model=MODEL_NAME,
                    timeout_s=rollout_timeout_s,
                    log_dir=self.run_dir / "logs",
                    nice=runners.processes_nice,
                ),
                runners.processes,
                id_prefix="trainer-process",
            )
            self._processes.start()
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
                model=MODEL_NAME,
                drain_timeout_s=5.0,
                on_lease=self._leased,
            )
            self._runners.append(asyncio.create_task(runner.run(stop=self._stop), name=f"runner-{i}"))
        return self

    def _leased(self, leased: list[LeasedRollout]) -> None:
        """The gateway learns of each leased attempt from the runner beside it or from the store's
        lease route (runner processes), not by asking the store on the attempt's first call."""
        self.gateway.attempts.remember_running(lr.attempt for lr in leased)

    @property
    def runner_pids(self) -> list[int]:
        """The runner children's process ids (none when the runners run in this process)."""
        return self._processes.pids if self._processes is not None else []

    def check_runners(self) -> None:
        """Raise a runner's crash here, in the trainer, instead of waiting for rollouts that never come."""
        for task in self._runners:
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise RuntimeError(f"runner {task.get_name()} crashed") from task.exception()
        if self._processes is not None:
            self._processes.check()

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

    async def publish(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Serve `state` as policy `version`: new calls wait while the weights are swapped, and calls
        held for this version go through once they are."""
        await self.gateway.pause()
        try:
            await self.engine.load_weights(state, version)
            self.gateway.release_version(version)
        finally:
            self.gateway.resume()

    async def stop(self) -> None:
        self._stop.set()
        if self._processes is not None:
            await asyncio.to_thread(self._processes.stop)
        if self._runners:
            await asyncio.wait(self._runners, timeout=30)
        for task in self._runners:
            task.cancel()
        with contextlib.suppress(Exception):
            await self.gateway.flush()
        await asyncio.to_thread(self.server.stop)
        await asyncio.to_thread(self.engine.stop)
        (self.run_dir / "store.url").unlink(missing_ok=True)
