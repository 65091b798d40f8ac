"""`Trainer.fit`: the RL loop, readable in one function (`_fit`).

One step: draw tasks → enqueue each task x group size, tagged with the resources version → runners run
the agent through the gateway and engine → wait for the rollouts → read their spans back as
transitions (credit/) → advantages (algorithms/) → policy update → publish weights vN+1 to the engine
→ metrics, validation, checkpoint. Everything the agent produces goes through the store.
"""

from __future__ import annotations

import asyncio
import collections
import copy
import gc
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reinforge.algorithms import GRPO, PPO, Algorithm, compute_advantages
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.runner import Agent, AgentFunction, CommandAgent
from reinforge.store.factory import open_store
from reinforge.store.protocol import Store
from reinforge.training.checkpoint import CheckpointMeta, latest_checkpoint, load_checkpoint, save_checkpoint
from reinforge.training.checkpoint import set_rng_state as restore_rng
from reinforge.training.config import TrainerConfig
from reinforge.training.data import TaskSampler
from reinforge.training.metrics import MetricsLog, plot_reward_curve
from reinforge.training.policy import Policy
from reinforge.training.progress import StepProgress
from reinforge.training.rollouts import (
    cancel_unfinished,
    finish_and_collect,
    mean_reward,
    rollout_specs,
    run_rollouts,
    success_rate,
)
from reinforge.training.spine import MODEL_NAME, Spine
from reinforge.types import RolloutMode, new_id

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

    `model` is a Hugging Face causal LM or the path of a `save_pretrained` folder (its tokenizer is
    loaded from there when `tokenizer` is None). Keyword overrides set `TrainerConfig` fields:
    `Trainer(model=m, algorithm=GRPO(group_size=8), runners=2, max_steps=50)`.
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
            path = str(model)
            model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
            tokenizer = tokenizer or AutoTokenizer.from_pretrained(path)
        if tokenizer is None:
            raise InvalidRequestError("give the tokenizer with the model (or a model folder that has one)")
        if tokenizer.pad_token_id is None:
            raise InvalidRequestError("the tokenizer needs a pad token for batched training")
        self.model = model
        self.tokenizer = tokenizer
        self.algorithm: Algorithm = algorithm or GRPO()
        self.credit = credit or CreditConfig()
        base = config or TrainerConfig()
        try:
            self.config = TrainerConfig.model_validate({**base.model_dump(), **overrides})
        except ValueError as exc:
            raise InvalidRequestError(f"invalid trainer settings: {exc}") from exc
        if (
            isinstance(self.algorithm, PPO)
            and self.credit.assignment != ("equal",)
            and ("discounted" in self.credit.assignment)
        ):
            raise InvalidRequestError("PPO discounts with its own gamma; use credit without 'discounted'")

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
        cfg.run_dir.mkdir(parents=True, exist_ok=True)
        token = cfg.store_token.get_secret_value() if cfg.store_token is not None else None
        store = await open_store(cfg.store_location, token)
        try:
            return await self._fit(store, agent, list(train_dataset), list(val_dataset))
        finally:
            await store.close()

    async def _fit(
        self,
        store: Store,
        agent: Agent | AgentFunction | CommandAgent,
        train: list[dict[str, Any]],
        val: list[dict[str, Any]],
    ) -> FitResult:
        cfg, algo = self.config, self.algorithm
        _seed_everything(cfg.seed)
        # The engine serves its own copy (taken before LoRA wraps the model): the trainer's weights
        # change in place during an update, the engine's only when a version is published.
        engine_model = copy.deepcopy(self.model).eval()
        policy = Policy(
            self.model,
            algo,
            pad_token_id=int(self.tokenizer.pad_token_id),
            learning_rate=cfg.learning_rate,
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            micro_batch_tokens=cfg.micro_batch_tokens,
            epochs_per_batch=cfg.epochs_per_batch,
            temperature=cfg.temperature,
            lora=cfg.lora,
        )
        sampler = TaskSampler(len(train), seed=cfg.seed)
        log = MetricsLog(cfg.run_dir)
        step, version, rl_seconds, resumed_from = 0, 0, 0.0, None

        # Resume: weights, optimiser, step, RNG, data position and the time already spent.
        checkpoint = latest_checkpoint(cfg.run_dir / "checkpoints") if cfg.resume else None
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
            log.truncate_after(step)
        else:
            log.truncate_after(-1)
        # A killed session may have left rollouts behind; they would hold runners' slots.
        await cancel_unfinished(store)

        spine = Spine(
            store,
            engine_model,
            self.tokenizer,
            cfg.run_dir,
            policy_version=version,
            engine_max_batch_size=cfg.engine_max_batch_size,
            engine_max_seq_len=cfg.engine_max_seq_len,
            engine_process=cfg.engine_process,
            seed=cfg.seed,
        )
        session = new_id()[:8]
        await spine.start(
            agent,
            runners=cfg.runners,
            concurrency=cfg.runner_concurrency,
            timeout_s=cfg.rollout_timeout_s,
            processes=cfg.runner_processes,
            processes_nice=cfg.runner_processes_nice,
        )
        if checkpoint is not None:
            await spine.publish(policy.engine_state(), version)
        progress = StepProgress(cfg.max_steps, start=step, enabled=cfg.progress)
        progress.note(f"run folder {cfg.run_dir}  dashboard {spine.dashboard_url}")

        async def validate(tag: str) -> dict[str, float]:
            """Held-out success, sampled at the training temperature and (optionally) greedy."""
            if not val:
                return {}
            out: dict[str, float] = {}
            runs = [("val/success", cfg.temperature)] + (
                [("val/greedy_success", 0.0)] if cfg.val_greedy else []
            )
            for key, temperature in runs:
                rv = await store.put_resources(self._resources(version, temperature))
                rollouts = await spine.watch(
                    run_rollouts(
                        store,
                        list(enumerate(val)),
                        prefix=f"{session}-{tag}-{key.split('/')[1]}",
                        group_size=1,
                        mode=RolloutMode.val,
                        resources_version=rv.version,
                        timeout_s=cfg.step_timeout_s,
                    )
                )
                out[key] = success_rate(rollouts)
            return out

        history_before = [r for r in log.records() if r.get("step") == 0 and "val/success" in r]
        try:
            _freeze_heap()
            if history_before:
                val_before = {k: v for k, v in history_before[-1].items() if k.startswith("val/")}
            else:
                val_before = await validate("before")
                if val_before:
                    log.log(0, val_before)
                    progress.note("before training: " + _fmt(val_before))
            started = time.monotonic() - rl_seconds
            recent_steps_s: collections.deque[float] = collections.deque(maxlen=_BUDGET_STEPS)
            sampler_state = sampler.state_dict()
            ahead: list[str] | None = None  # the next step's rollouts, started early
            # Prefetching while this step generates needs free runner slots for the next step's
            # agents (they hold theirs while they wait); without them it starts after this step's
            # rollouts end, so that its waiting agents can never take a slot a retry needs.
            # In-process agents would run their pre-call Python under this process's interpreter lock,
            # slowing the update more than it saves: by default only runner processes prefetch.
            prefetch = cfg.runner_processes > 0 if cfg.prefetch_rollouts is None else cfg.prefetch_rollouts
            slots = (cfg.runner_processes or cfg.runners) * cfg.runner_concurrency
            prefetch_early = prefetch and slots >= 2 * cfg.tasks_per_step * algo.group_size

            def budget_left(steps: int) -> bool:
                """Whether `steps` more steps likely fit in the time budget."""
                if cfg.max_minutes is None:
                    return True
                longest = max(recent_steps_s, default=0.0)
                return time.monotonic() - started + steps * longest <= cfg.max_minutes * 60

            async def start_step(number: int, policy_version: int, *, hold: bool = False) -> list[str]:
                """Enqueue step `number`'s rollouts, sampled by `policy_version`; with `hold`, their
                calls wait at the gateway until that version is published."""
                indices = sampler.next_batch(cfg.tasks_per_step)
                rv = await store.put_resources(self._resources(policy_version, cfg.temperature))
                specs = rollout_specs(
                    [(i, train[i]) for i in indices],
                    prefix=f"{session}-s{number}",
                    group_size=algo.group_size,
                    mode=RolloutMode.train,
                    resources_version=rv.version,
                )
                if hold:
                    spine.hold([str(s.rollout_id) for s in specs], policy_version)
                return [r.rollout_id for r in await store.enqueue_rollouts(specs)]

            def may_start_ahead() -> bool:
                return ahead is None and step < cfg.max_steps and budget_left(2)

            while step < cfg.max_steps:
                # Stop before a step that would likely end past the budget, not after it.
                if not budget_left(1):
                    break
                spine.check_runners()
                t0 = time.monotonic()
                step += 1
                ids = ahead if ahead is not None else await start_step(step, version)
                ahead = None
                sampler_state = sampler.state_dict()  # a checkpoint after this step resumes here
                if prefetch_early and not cfg.overlap_rollouts and may_start_ahead():
                    # The next step's agents start while this step generates; their LLM calls wait
                    # at the gateway until the next version is published (strictly on-policy).
                    ahead = await start_step(step + 1, version + 1, hold=True)
                rollouts, transitions, credit_metrics = await spine.watch(
                    finish_and_collect(store, ids, cfg.step_timeout_s, self.credit)
                )
                t_rollout = time.monotonic() - t0
                if may_start_ahead():
                    if cfg.overlap_rollouts:
                        # Generated by this version while it is being updated: one version behind
                        # when trained on (behaviour logprobs recorded, TIS weighs the lag).
                        ahead = await start_step(step + 1, version)
                    elif prefetch:
                        # As above, with the agents starting during the update instead.
                        ahead = await start_step(step + 1, version + 1, hold=True)
                values = (
                    await asyncio.to_thread(policy.values, transitions) if isinstance(algo, PPO) else None
                )
                advantages = compute_advantages(transitions, algo, values=values)
                t1 = time.monotonic()
                run_done = (step - 1) / max(cfg.max_steps, 1)
                if cfg.max_minutes is not None:
                    run_done = max(run_done, (t1 - started) / (cfg.max_minutes * 60))
                learning_rate = cfg.learning_rate_at(run_done)
                policy.set_learning_rate(learning_rate)
                update = await asyncio.to_thread(policy.update, transitions, advantages.returns)
                t_update = time.monotonic() - t1
                version += 1
                await spine.publish(policy.engine_state(), version)
                record: dict[str, Any] = {
                    "policy_version": version,
                    "train/reward": mean_reward(rollouts),
                    "train/success": success_rate(rollouts),
                    "train/rollouts": len(rollouts),
                    "time/rollout_s": t_rollout,
                    "time/update_s": t_update,
                    "time/step_s": time.monotonic() - t0,
                    "update/learning_rate": learning_rate,
                    **credit_metrics.as_dict(),
                    **advantages.metrics,
                    **update,
                }
                if cfg.val_every and step % cfg.val_every == 0 and step < cfg.max_steps:
                    record.update(await validate(f"s{step}"))
                record["time/rl_s"] = time.monotonic() - started
                recent_steps_s.append(time.monotonic() - t0)
                log.log(step, record)
                progress.advance(step, record)
                if cfg.checkpoint_every and step % cfg.checkpoint_every == 0:
                    self._checkpoint(policy, sampler_state, step, version, time.monotonic() - started)
            if ahead is not None:
                # Started for a step the budget then left out: not trained on, so not left running.
                await store.cancel_rollouts(ahead)
                spine.drop_holds(ahead)
            rl_seconds = time.monotonic() - started
            if resumed_from is None or step > resumed_from:
                self._checkpoint(policy, sampler_state, step, version, rl_seconds)
            val_after = await validate("after")
            if val_after:
                log.log(step, {"final": 1, **val_after})
                progress.note("after training: " + _fmt(val_after))
        finally:
            gc.unfreeze()
            progress.close()
            await spine.stop()
            log.close()
        records = log.records()
        curve = None
        if any("train/reward" in r for r in records):
            curve = plot_reward_curve(records, cfg.run_dir / "reward_curve.png")
        return FitResult(
            run_dir=cfg.run_dir,
            steps=step,
            policy_version=version,
            rl_seconds=rl_seconds,
            resumed_from=resumed_from,
            val_before=val_before,
            val_after=val_after,
            curve=curve,
            dashboard_url=spine.dashboard_url,
            history=records,
        )

    def _resources(self, version: int, temperature: float) -> dict[str, Any]:
        """What an attempt is given: the model name, the policy version and how to sample."""
        return {
            "llm": {"model": MODEL_NAME},
            "policy_version": version,
            "sampling": {"temperature": temperature, "max_tokens": self.config.max_tokens},
        }

    def _checkpoint(
        self, policy: Policy, sampler_state: dict[str, Any], step: int, version: int, rl_seconds: float
    ) -> None:
        """`sampler_state` is the data position after the last trained step (a step started ahead
        is drawn again on resume)."""
        meta = CheckpointMeta(step=step, policy_version=version, sampler=sampler_state, rl_seconds=rl_seconds)
        save_checkpoint(
            self.config.run_dir / "checkpoints", meta, policy.state_dict(), keep=self.config.keep_checkpoints
        )


_BUDGET_STEPS = 5
"""Steps whose longest duration predicts the next one's for `max_minutes`: step times vary (longer
answers, a slow validation), and predicting with the last one alone let runs end past the budget."""


def _freeze_heap() -> None:
    """Move everything alive now (model, tokenizer, libraries, spine) out of the collector's reach.

    A step allocates enough container objects to trigger a full (generation 2) collection every few
    steps, and a full collection walks the whole heap: ~330 ms here, over half a step. What exists
    before training lives until the end, so it is frozen (`gc.freeze`) and unfrozen when fit ends;
    later collections walk only what training itself allocated.
    """
    gc.collect()
    gc.freeze()


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _fmt(values: dict[str, float]) -> str:
    return "  ".join(f"{k.split('/')[-1]}={v:.3f}" for k, v in values.items())
