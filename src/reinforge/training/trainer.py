"""`Trainer.fit`: the RL loop (`_fit`) around one step function (`_step`).

One step: enqueue each drawn task x group size, tagged with the resources version → runners run the
agent through the gateway and engine → collect the rollouts, their spans read back as transitions
(credit/) → advantages (algorithms/) → policy update → publish weights vN+1 to the engine → log.
Around it, the loop validates and checkpoints when due; when each step's rollouts start and whether
another step fits the time budget is the scheduler's (`scheduling.py`). Everything the agent
produces goes through the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reinforge._heap import freeze_startup_heap
from reinforge.algorithms import GRPO, PPO, Algorithm, compute_advantages
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.models import resolve_model
from reinforge.runner import Agent, AgentFunction, CommandAgent
from reinforge.store.factory import open_store
from reinforge.store.protocol import Store
from reinforge.training.async_rollouts import AsyncRollouts
from reinforge.training.checkpoint import CheckpointMeta, latest_checkpoint, load_checkpoint, save_checkpoint
from reinforge.training.checkpoint import set_rng_state as restore_rng
from reinforge.training.config import TrainerConfig
from reinforge.training.data import TaskSampler
from reinforge.training.device import Placement, resolve_placement
from reinforge.training.distributed import (
    DataParallel,
    LeaderOrder,
    follow_leader,
    join_data_parallel,
    launched_world,
)
from reinforge.training.flat_settings import upgrade_flat_settings
from reinforge.training.fsdp import refuse_unshardable
from reinforge.training.memory import returning_freed_memory
from reinforge.training.metrics import MetricsLog, phase_timer, plot_reward_curve
from reinforge.training.policy import Policy
from reinforge.training.progress import StepProgress
from reinforge.training.rollout_stack import RolloutStack
from reinforge.training.rollouts import (
    TrainingRollouts,
    attempt_resources,
    cancel_unfinished,
    finish_and_collect,
    mean_llm_calls,
    mean_reward,
    rollout_specs,
    run_rollouts,
    success_rate,
)
from reinforge.training.scheduling import RolloutScheduler
from reinforge.training.transition_log import TransitionLog
from reinforge.types import RolloutMode, Transition, new_id

Dataset = Sequence[dict[str, Any]]


@dataclass
class FitResult:
    """What a fit did; `history` is the metrics log (one dict per step, plus validation records)."""

    run_dir: Path
    steps: int
    policy_version: int
    rl_seconds: float
    resumed_from: int | None
    val_before: dict[str, float] = field(default_factory=dict)
    val_after: dict[str, float] = field(default_factory=dict)
    curve: Path | None = None
    dashboard_url: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)


class Trainer:
    """Train an agent's policy with RL.

    `model` is a Hugging Face causal LM, the path of a `save_pretrained` folder, or a model hub id
    (its tokenizer is loaded from there when `tokenizer` is None). Keyword overrides set
    `TrainerConfig` fields on top of `config`; a group given as a dict changes only the fields it
    names, a group given as an object replaces the whole group:
    `Trainer(m, tok, run_dir="runs/a", schedule={"max_steps": 50})`.
    """

    def __init__(
        self,
        model: PreTrainedModel | str | Path,
        tokenizer: PreTrainedTokenizerBase | None = None,
        *,
        algorithm: Algorithm | None = None,
        credit: CreditConfig | None = None,
        config: TrainerConfig | None = None,
        **overrides: Any,
    ) -> None:
        if isinstance(model, str | Path):
            # A folder, a packaged model's name or a .gguf file (converted into the models cache), or
            # else a hub id: resolve_model makes each something from_pretrained loads.
            path = resolve_model(model)
            try:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
                tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
            except OSError as exc:
                raise InvalidRequestError(f"cannot load the model {path!r}: {exc}") from exc
        if tokenizer is None:
            raise InvalidRequestError("give the tokenizer with the model (or a model folder that has one)")
        if tokenizer.pad_token_id is None:
            raise InvalidRequestError("the tokenizer needs a pad token for batched training")
        self.model = model
        self.tokenizer = tokenizer
        self.algorithm: Algorithm = algorithm or GRPO()
        self.credit = credit or CreditConfig()
        base = (config or TrainerConfig()).model_dump()
        overrides = upgrade_flat_settings(overrides, stacklevel=2)
        merged = {
            key: {**base[key], **value} if _is_group_patch(value, base.get(key)) else value
            for key, value in overrides.items()
        }
        try:
            self.config = TrainerConfig.model_validate({**base, **merged})
        except ValueError as exc:
            raise InvalidRequestError(f"invalid trainer settings: {exc}") from exc
        if (
            isinstance(self.algorithm, PPO)
            and self.credit.assignment != ("equal",)
            and ("discounted" in self.credit.assignment)
        ):
            raise InvalidRequestError("PPO discounts with its own gamma; use credit without 'discounted'")
        if self.config.distributed.sharding == "fsdp2":
            refuse_unshardable(self.algorithm, self.config.optim)
        self._placement: Placement | None = None
        self._data_parallel: DataParallel | None = None
        """Set by each fit: where the update computes, and the training processes it belongs to."""

    def fit(
        self, agent: Agent | AgentFunction | CommandAgent, train_dataset: Dataset, val_dataset: Dataset = ()
    ) -> FitResult:
        """Run training to the step or time budget (resuming from the run folder's checkpoint)."""
        return asyncio.run(self.fit_async(agent, train_dataset, val_dataset))

    async def fit_async(
        self, agent: Agent | AgentFunction | CommandAgent, train_dataset: Dataset, val_dataset: Dataset = ()
    ) -> FitResult:
        if not train_dataset:
            raise InvalidRequestError("the training dataset is empty")
        cfg = self.config
        world = launched_world()
        self._placement = resolve_placement(cfg.compute, local_rank=world.local_rank if world else None)
        self._data_parallel = data_parallel = join_data_parallel(cfg.distributed, self._placement)
        try:
            if data_parallel is not None and not data_parallel.is_leader:
                return await asyncio.to_thread(self._follow, data_parallel)
            cfg.run_dir.mkdir(parents=True, exist_ok=True)
            token = cfg.store.token.get_secret_value() if cfg.store.token is not None else None
            store = await open_store(cfg.store_location, token)
            try:
                with returning_freed_memory(cfg.compute.return_freed_memory):
                    run = await self._open_run(store, agent, list(train_dataset), list(val_dataset))
                    return await self._fit(run)
            finally:
                await store.close()
        finally:
            if data_parallel is not None:
                if data_parallel.is_leader and not data_parallel.broken:
                    data_parallel.send(LeaderOrder(kind="stop"))
                data_parallel.close()
                self._data_parallel = None

    def _follow(self, data_parallel: DataParallel) -> FitResult:
        """A rank other than 0: its copy of the policy takes part in each update the leader orders
        (`reinforge.training.distributed`); the run's store, serving, logs and checkpoints are the
        leader's. Its result counts the updates it took part in."""
        policy = self._new_policy()
        if policy.device.type == "cuda":  # this runs in a worker thread; collectives use its GPU
            torch.cuda.set_device(policy.device)
        start = data_parallel.receive()
        if start.kind == "start":
            if start.checkpoint is not None:
                policy.load_state_dict(load_checkpoint(Path(start.checkpoint))[1])
            data_parallel.broadcast_parameters(policy.all_parameters())
            policy.shard()  # FSDP2 when configured: from the same weights everywhere
            updates = follow_leader(policy, data_parallel)
        else:  # the leader stopped before its first step
            updates = 0
        return FitResult(
            run_dir=self.config.run_dir,
            steps=updates,
            policy_version=updates,
            rl_seconds=0.0,
            resumed_from=None,
        )

    def _new_policy(self) -> Policy:
        cfg = self.config
        return Policy(
            self.model,
            self.algorithm,
            cfg.optim,
            pad_token_id=int(self.tokenizer.pad_token_id),
            temperature=cfg.rollouts.temperature,
            top_p=cfg.rollouts.top_p,
            top_k=cfg.rollouts.top_k,
            placement=self._placement or resolve_placement(cfg.compute),
            data_parallel=self._data_parallel,
        )

    async def _fit(self, run: _Run) -> FitResult:
        """Train the opened run to its end (step budget or time), then validate and stop its stack."""
        cfg = self.config
        try:
            # What exists before training (model, tokenizer, libraries, rollout stack) lives until
            # the end: frozen out of the full collections a step triggers (docs/training.md), and
            # unfrozen when fit ends.
            freeze_startup_heap()
            val_before = await self._validate_before(run)
            scheduler = RolloutScheduler(
                cfg.schedule,
                run.queue,
                runner_slots=cfg.runners.slots,
                rollouts_per_step=cfg.rollouts.tasks_per_step * self.algorithm.group_size,
                runner_processes=cfg.runners.out_of_process,
                rl_seconds=run.rl_seconds,
            )
            # Stop before a step that would likely end past the budget, not after it.
            while run.step < cfg.schedule.max_steps and scheduler.fits(1):
                run.stack.check_runners()
                run.step += 1
                with scheduler.time_step():
                    if run.async_rollouts is not None:
                        record = await self._step_async(run, run.async_rollouts, scheduler)
                    else:
                        record = await self._step(run, scheduler)
                    if self._validation_due(run.step):
                        record.update(await self._validate(run, f"s{run.step}"))
                record["time/rl_s"] = scheduler.rl_seconds
                run.log.log(run.step, record)
                run.progress.advance(run.step, record)
                if cfg.checkpoints.every and run.step % cfg.checkpoints.every == 0:
                    self._checkpoint(run, scheduler.rl_seconds)
            await scheduler.cancel_ahead()
            run.rl_seconds = scheduler.rl_seconds
            if run.resumed_from is None or run.step > run.resumed_from:
                self._checkpoint(run, run.rl_seconds)
            if run.async_rollouts is not None:  # the checkpoint recorded them; a resume re-enqueues
                await run.async_rollouts.cancel_in_flight()
            val_after = await self._validate(run, "after")
            if val_after:
                run.log.log(run.step, {"final": 1, **val_after})
                run.progress.note("after training: " + _fmt(val_after))
        finally:
            gc.unfreeze()
            run.progress.close()
            await run.stack.stop()
            run.log.close()
        records = run.log.records()
        curve = None
        if any("train/reward" in r for r in records):
            curve = plot_reward_curve(records, cfg.run_dir / "reward_curve.png")
        return FitResult(
            run_dir=cfg.run_dir,
            steps=run.step,
            policy_version=run.version,
            rl_seconds=run.rl_seconds,
            resumed_from=run.resumed_from,
            val_before=val_before,
            val_after=val_after,
            curve=curve,
            dashboard_url=run.stack.dashboard_url,
            history=records,
        )

    async def _step(self, run: _Run, scheduler: RolloutScheduler) -> dict[str, Any]:
        """One RL step, `run.step`: enqueue → collect (with credit) → advantages → update → publish.

        Returns the step's metrics record, each phase's wall time in it as `time/<phase>_s`.
        """
        cfg, algo = self.config, self.algorithm
        times: dict[str, float] = {}
        with phase_timer("step", times):
            with phase_timer("enqueue", times):
                batch = await scheduler.start_step(run.step, run.version)
            run.data_position = batch.data_position  # a checkpoint after this step resumes here
            with phase_timer("collect", times):
                # Credit is assigned as each rollout ends (its spans read while the others still
                # run), so when the last one ends only its own transitions are left to build.
                rollouts, transitions, credit = await run.stack.watch(
                    finish_and_collect(run.store, batch.rollout_ids, cfg.rollouts.step_timeout_s, self.credit)
                )
            with phase_timer("enqueue", times):
                await scheduler.rollouts_collected(run.step, run.version)
            with phase_timer("advantages", times):
                values = (
                    await asyncio.to_thread(run.policy.values, transitions) if isinstance(algo, PPO) else None
                )
                advantages = compute_advantages(transitions, algo, values=values)
            learning_rate = cfg.optim.learning_rate_at(scheduler.run_progress(run.step - 1))
            update = await self._learn(run, transitions, advantages.returns, learning_rate, times)
        return {
            "policy_version": run.version,
            "train/reward": mean_reward(rollouts),
            "train/success": success_rate(rollouts),
            "train/rollouts": len(rollouts),
            "update/learning_rate": learning_rate,
            **times,
            **credit.as_dict(),
            **advantages.metrics,
            **update,
        }

    async def _step_async(
        self, run: _Run, pool: AsyncRollouts, scheduler: RolloutScheduler
    ) -> dict[str, Any]:
        """One RL step of the asynchronous schedule (`schedule.max_staleness` >= 1): the complete
        groups in flight, whichever step drew them → advantages over whole groups → the update on
        the transitions within the staleness bound → publish (`async_rollouts.py`)."""
        cfg, algo = self.config, self.algorithm
        times: dict[str, float] = {}
        with phase_timer("step", times):
            with phase_timer("collect", times):
                batch = await run.stack.watch(pool.next_batch(run.version, cfg.rollouts.step_timeout_s))
            run.data_position = pool.data_position
            with phase_timer("advantages", times):
                values = None
                if isinstance(algo, PPO):
                    values = await asyncio.to_thread(run.policy.values, batch.transitions)
                advantages = compute_advantages(batch.transitions, algo, values=values)
                transitions, returns = batch.trained(advantages.returns)
            learning_rate = cfg.optim.learning_rate_at(scheduler.run_progress(run.step - 1))
            update = await self._learn(run, transitions, returns, learning_rate, times)
        return {
            "policy_version": run.version,
            "train/reward": mean_reward(batch.rollouts),
            "train/success": success_rate(batch.rollouts),
            "train/rollouts": len(batch.rollouts),
            "update/learning_rate": learning_rate,
            **times,
            **batch.credit.as_dict(),
            **batch.metrics,
            **advantages.metrics,
            **update,
        }

    async def _learn(
        self,
        run: _Run,
        transitions: Sequence[Transition],
        returns: Sequence[float] | None,
        learning_rate: float,
        times: dict[str, float],
    ) -> dict[str, Any]:
        """The tail both schedules share: update (the transitions logged meanwhile) → publish vN+1.

        The transitions' record (their credit and advantages, for the dashboard) is written in a
        second thread during the update rather than after it, on the step's path: the update's torch
        ops release the interpreter lock, and (synchronous schedule) the runners and the engine wait
        for the new version meanwhile, so the decoding has a core to itself. `time/transitions_s` is
        what remains of the write once the update is done.
        """
        run.policy.set_learning_rate(learning_rate)
        run.stack.release_engine_cache()
        with phase_timer("update", times):
            updating = asyncio.ensure_future(asyncio.to_thread(run.policy.update, transitions, returns))
            write = run.transition_log.write
            writing = asyncio.ensure_future(asyncio.to_thread(write, run.step, transitions))
            try:
                update = await updating
            except BaseException:
                with contextlib.suppress(BaseException):  # the update's error is the one to raise
                    await writing
                raise
        with phase_timer("transitions", times):
            await writing
        with phase_timer("publish", times):
            # The version advances only once the backend serves it (a failed sync raises).
            await run.stack.publish(run.policy, run.version + 1)
            run.version += 1
        return update

    async def _open_run(
        self,
        store: Store,
        agent: Agent | AgentFunction | CommandAgent,
        train: list[dict[str, Any]],
        val: list[dict[str, Any]],
    ) -> _Run:
        """The policy (resumed from the run folder's last checkpoint when there is one), and the
        rollout stack serving it, started; the run's seed set first."""
        cfg = self.config
        _seed_everything(cfg.seed)
        # The embedded engine serves its own copy (taken before LoRA wraps the model): the trainer's
        # weights change in place during an update, the engine's only when a version is published.
        # An upstream server holds its own weights; it needs only the model's config.
        embedded = cfg.engine.backend == "embedded"
        engine_model = copy.deepcopy(self.model).eval() if embedded else self.model
        policy = self._new_policy()
        if embedded:  # on the update's device, in its compute precision
            torch.nn.Module.to(engine_model, policy.device, policy.placement.engine_dtype)
        sampler = TaskSampler(len(train), seed=cfg.seed)
        step, version, rl_seconds, resumed_from = 0, 0, 0.0, None
        resumed_extra: dict[str, Any] = {}
        # Resume: weights, optimiser, step, RNG, data position and the time already spent.
        checkpoint = latest_checkpoint(cfg.run_dir / "checkpoints") if cfg.checkpoints.resume else None
        # W&B and MLflow continue this folder's runs on a resume; a fresh start starts new ones.
        log = MetricsLog(
            cfg.run_dir,
            cfg.logging,
            params={"trainer": cfg, "algorithm": self.algorithm, "credit": self.credit},
            continue_runs=checkpoint is not None,
        )
        if checkpoint is not None:
            meta, policy_state, rng = load_checkpoint(checkpoint)
            policy.load_state_dict(policy_state)
            sampler.load_state_dict(meta.sampler)
            restore_rng(rng)
            step, version, rl_seconds, resumed_from = (
                meta.step,
                meta.policy_version,
                meta.rl_seconds,
                meta.step,
            )
            resumed_extra = meta.extra
        if self._data_parallel is not None:  # the other ranks start from this policy, exactly
            self._data_parallel.send(
                LeaderOrder(kind="start", checkpoint=str(checkpoint) if checkpoint is not None else None)
            )
            self._data_parallel.broadcast_parameters(policy.all_parameters())
            policy.shard()  # FSDP2 when configured; the followers shard alike
        log.truncate_after(step if checkpoint is not None else -1)
        transition_log = TransitionLog(cfg.run_dir, self.tokenizer)
        transition_log.truncate_after(step)
        # A killed session may have left rollouts behind; they would hold runners' slots.
        await cancel_unfinished(store)
        stack = RolloutStack(
            store,
            engine_model,
            self.tokenizer,
            cfg.run_dir,
            cfg.engine,
            policy_version=version,
            seed=cfg.seed,
            serve=cfg.serve,
        )
        session = new_id()[:8]
        await stack.start(agent, cfg.runners, rollout_timeout_s=cfg.rollouts.timeout_s)
        if checkpoint is not None or policy.roles:  # per-role adapters: the engine starts without them
            await stack.publish(policy, version)
        progress = StepProgress(cfg.schedule.max_steps, start=step, enabled=cfg.progress)
        progress.note(f"run folder {cfg.run_dir}  dashboard {stack.dashboard_url}")
        queue = TrainingRollouts(
            store, stack, sampler, train, cfg.rollouts, group_size=self.algorithm.group_size, prefix=session
        )
        async_rollouts = None
        if cfg.schedule.max_staleness > 0:
            async_rollouts = AsyncRollouts(
                store,
                sampler,
                train,
                cfg.rollouts,
                self.credit,
                max_staleness=cfg.schedule.max_staleness,
                group_size=self.algorithm.group_size,
                prefix=session,
            )
            if "async_rollouts" in resumed_extra:
                await async_rollouts.restore(resumed_extra["async_rollouts"], version)
        return _Run(
            store=store,
            stack=stack,
            policy=policy,
            queue=queue,
            log=log,
            transition_log=transition_log,
            progress=progress,
            session=session,
            val=val,
            step=step,
            version=version,
            rl_seconds=rl_seconds,
            resumed_from=resumed_from,
            data_position=sampler.state_dict(),
            async_rollouts=async_rollouts,
        )

    def _validation_due(self, step: int) -> bool:
        """Every `val_every` steps, except after the last step: the "after" validation follows it."""
        every, last = self.config.schedule.val_every, self.config.schedule.max_steps
        return every > 0 and step % every == 0 and step < last

    async def _validate_before(self, run: _Run) -> dict[str, float]:
        """The held-out numbers before training: measured now, or kept from the first session."""
        before = [r for r in run.log.records() if r.get("step") == 0 and "val/success" in r]
        if before:
            return {k: v for k, v in before[-1].items() if k.startswith("val/")}
        measured = await self._validate(run, "before")
        if measured:
            run.log.log(0, measured)
            run.progress.note("before training: " + _fmt(measured))
        return measured

    async def _validate(self, run: _Run, tag: str) -> dict[str, float]:
        """Held-out success, mean reward and model calls per episode, sampled at the training
        temperature and (optionally) greedy: success counts rewards of 1, the mean reward is what a
        graded reward (an F1) shows, `val/calls` how many LLM calls an episode made."""
        if not run.val:
            return {}
        cfg = self.config
        out: dict[str, float] = {}
        runs = [("val/success", cfg.rollouts.temperature)] + (
            [("val/greedy_success", 0.0)] if cfg.schedule.val_greedy else []
        )
        for key, temperature in runs:
            resources = attempt_resources(run.version, cfg.rollouts.sampling_at(temperature))
            rv = await run.store.put_resources(resources)
            specs = rollout_specs(
                list(enumerate(run.val)),
                prefix=f"{run.session}-{tag}-{key.split('/')[1]}",
                group_size=1,
                mode=RolloutMode.val,
                resources_version=rv.version,
            )
            rollouts = await run.stack.watch(run_rollouts(run.store, specs, cfg.rollouts.step_timeout_s))
            out[key] = success_rate(rollouts)
            out[key.replace("success", "reward")] = mean_reward(rollouts)
            out[key.replace("success", "calls")] = await mean_llm_calls(run.store, rollouts)
        return out

    def _checkpoint(self, run: _Run, rl_seconds: float) -> None:
        """The data position saved is after the last trained step (a step started ahead is drawn
        again on resume)."""
        pool = run.async_rollouts
        meta = CheckpointMeta(
            step=run.step,
            policy_version=run.version,
            sampler=run.data_position,
            rl_seconds=rl_seconds,
            extra={"async_rollouts": pool.state_dict()} if pool is not None else {},
        )
        checkpoints = self.config.run_dir / "checkpoints"
        save_checkpoint(checkpoints, meta, run.policy.state_dict(), keep=self.config.checkpoints.keep)


@dataclass
class _Run:
    """One fit's moving parts and position: what the step function reads and advances."""

    store: Store
    stack: RolloutStack
    policy: Policy
    queue: TrainingRollouts
    log: MetricsLog
    transition_log: TransitionLog
    progress: StepProgress
    session: str
    val: list[dict[str, Any]]
    step: int
    version: int
    rl_seconds: float
    resumed_from: int | None
    data_position: dict[str, Any]
    async_rollouts: AsyncRollouts | None = None
    """The asynchronous schedule's rollout pool (`schedule.max_staleness` >= 1), else None."""


def _is_group_patch(value: Any, current: Any) -> bool:
    """A dict override of a group: it changes the fields it names and keeps the rest."""
    return isinstance(value, dict) and isinstance(current, dict)


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _fmt(values: dict[str, float]) -> str:
    return "  ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in values.items())
