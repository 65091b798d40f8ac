"""The trainer's settings: one validated object made of groups, also readable from a TOML file.

`TrainerConfig` holds what identifies a run (`run_dir`, `seed`, `progress`) and one sub-model per
concern, each handed as an object to the part that uses it: `optim` to the `Policy`, `engine` to the
serving stack, `runners` to its start, `schedule` to the rollout scheduler. In a TOML run file the
groups are sub-tables of `[trainer]`: `[trainer.optim]`, `[trainer.rollouts]`, `[trainer.runners]`,
`[trainer.engine]`, `[trainer.schedule]`, `[trainer.checkpoints]`, `[trainer.store]`.

A setting written the old, flat way (`learning_rate` directly under `[trainer]`) is refused with the
place it moved to, instead of being silently ignored or guessed.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

_ROLE_NAME = re.compile(r"[A-Za-z0-9_-]+")


class LoraSettings(BaseModel):
    """Train low-rank adapters (peft) instead of every weight.

    Without `roles`, one adapter is shared by every call and the engine gets merged weights. With
    `roles`, each listed role (an agent name, as calls reach `/agents/<name>/v1`) gets its own adapter
    named after it on one shared frozen base, trained only on that role's transitions; the engine
    serves each call with its agent's adapter, and roles not listed run on the plain base model.
    """

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    roles: list[str] | None = None
    """One adapter per listed role instead of one shared adapter (names: letters, digits, `_`, `-`)."""

    @field_validator("roles")
    @classmethod
    def _valid_roles(cls, value: list[str] | None) -> list[str] | None:
        # Names become peft module keys and engine weight names ("lora/<role>/..."): no dots or slashes.
        if value is None:
            return None
        if not value:
            raise ValueError("roles must list at least one role (leave it out for one shared adapter)")
        bad = [name for name in value if not _ROLE_NAME.fullmatch(name)]
        if bad:
            raise ValueError(f"role names may hold only letters, digits, '_' and '-'; got {bad}")
        clashing = [name for name in value if name in "lora_"]  # peft may reinitialise these on load
        if clashing:
            raise ValueError(f"role names must not be part of 'lora_' (peft's prefix); got {clashing}")
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"role names must be unique; repeated: {repeated}")
        return value


class OptimSettings(BaseModel):
    """The policy update.

    Attributes:
        learning_rate / weight_decay / max_grad_norm: the AdamW optimiser of the policy update.
        lr_schedule: "constant", or "linear" / "cosine" decay from `learning_rate` to
            `learning_rate * lr_final_ratio` over the run (its progress is the larger of steps done
            over `schedule.max_steps` and, with `schedule.max_minutes`, RL time spent over that
            budget), so the policy the run ends with is not caught mid-stride by a full-size step.
        epochs_per_batch: passes over one step's transitions (> 1 makes the PPO ratio and TIS matter).
        micro_batch_tokens: the most (padded) tokens in one forward/backward; gradients accumulate.
        lora: train LoRA adapters instead of the full model.
    """

    model_config = ConfigDict(extra="forbid")

    learning_rate: float = Field(default=3e-4, gt=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    lr_final_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    epochs_per_batch: int = Field(default=1, ge=1)
    micro_batch_tokens: int = Field(default=8192, ge=64)
    lora: LoraSettings | None = None

    def learning_rate_at(self, progress: float) -> float:
        """The scheduled learning rate when `progress` (0 to 1) of the run is done."""
        if self.lr_schedule == "constant":
            return self.learning_rate
        done = min(max(progress, 0.0), 1.0)
        left = 1.0 - done if self.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return self.learning_rate * (self.lr_final_ratio + (1.0 - self.lr_final_ratio) * left)


class RolloutSettings(BaseModel):
    """What one step samples.

    Attributes:
        tasks_per_step: distinct tasks per step; each runs `group_size` times (from the algorithm).
        temperature: the sampling temperature of training rollouts (and of "sampled" validation).
        max_tokens: the most tokens one LLM call may generate (given to the agent as a resource).
        timeout_s: the most one attempt may take.
        step_timeout_s: the most one step's rollouts may take before the stragglers are cancelled.
    """

    model_config = ConfigDict(extra="forbid")

    tasks_per_step: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0)
    max_tokens: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    step_timeout_s: float = Field(default=600.0, gt=0)


class RunnerSettings(BaseModel):
    """Who runs the agents.

    Attributes:
        count: in-process runners; each runs up to `concurrency` attempts at once.
        concurrency: attempts one runner (or one runner process) runs at once.
        processes: run the agents in this many `reinforge runner` child processes instead of in-process
            runners. Agents' Python then runs beside the trainer's, not under its interpreter lock: on
            a machine with two or more cores this is the faster setting. The agent must be importable
            by name (a module-level function or class). 0 keeps the runners in this process.
        processes_nice: how much lower the runner children's CPU priority is than the trainer's (added
            to their niceness, 0-19). While the engine generates a step, the children mostly prepare
            the next step's calls (`schedule.prefetch_rollouts`): on a machine with few cores the
            engine, on every step's critical path, should get the CPU first.
    """

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=1)
    concurrency: int = Field(default=64, ge=1)
    processes: int = Field(default=0, ge=0)
    processes_nice: int = Field(default=10, ge=0, le=19)

    @property
    def slots(self) -> int:
        """Attempts all runners together run at once."""
        return (self.processes or self.count) * self.concurrency


class EngineSettings(BaseModel):
    """The embedded engine that serves the policy to the agents.

    Attributes:
        max_batch_size: sequences the engine decodes together.
        max_seq_len: the longest prompt + completion the engine serves (sizes its KV cache).
        process: run the engine in its own child process (`EngineProcess`), so its scheduling loop
            does not share the interpreter lock with the gateway and store that answer the agents.
            Off by default: on a machine with few cores the CPU, not the lock, is what runs out, and
            a third busy process slows the step (docs/training.md); it is for machines with cores
            to spare.
        retain_prefixes: keep finished calls' KV caches in free slots so a later prompt that extends
            one (an agent's next call, another request on the same schema) copies it (docs/engine.md).
    """

    model_config = ConfigDict(extra="forbid")

    max_batch_size: int = Field(default=64, ge=1)
    max_seq_len: int = Field(default=512, ge=16)
    process: bool = False
    retain_prefixes: bool = True


class ScheduleSettings(BaseModel):
    """How long the run goes, when it validates, and when each step's rollouts start.

    Attributes:
        max_steps: RL steps (policy updates) to run at most.
        max_minutes: stop after this much RL wall time (None: no time limit); validation time counts.
        val_every: validate every N steps (0: only before and after training).
        val_greedy: also validate with greedy decoding.
        prefetch_rollouts: start the next step's agents early (while this step generates when the
            runners have room for two steps' rollouts, else during the update); their LLM calls
            wait at the gateway until the updated weights are published, so every token is still
            sampled by the policy it trains (strictly on-policy). What an agent does before its
            first call, and the runners' leasing, then overlaps this step instead of delaying the
            next one. None (the default) prefetches with `runners.processes` only: in-process
            agents would run that Python under the trainer's interpreter lock, during the update.
            Ignored when `overlap_rollouts` is set.
        overlap_rollouts: start the next step's rollouts before this step's policy update, so the
            engine generates while the trainer updates. Those rollouts are sampled by the policy
            one version behind the one they update (or by the new one, for calls that start after
            the weights are published): the behaviour logprobs recorded with each token and the
            loss's truncated importance weights (`tis_cap`) correct for the lag, but it is no
            longer strictly on-policy, so it is off by default.
    """

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=100, ge=0)
    max_minutes: float | None = Field(default=None, gt=0)
    val_every: int = Field(default=10, ge=0)
    val_greedy: bool = True
    prefetch_rollouts: bool | None = None
    overlap_rollouts: bool = False


class CheckpointSettings(BaseModel):
    """When the run saves its state, and whether it starts from the last save.

    Attributes:
        every: checkpoint every N steps (0: only at the end); `resume` picks the latest.
        keep: how many checkpoints to keep on disk.
        resume: continue from the latest checkpoint in run_dir when there is one.
    """

    model_config = ConfigDict(extra="forbid")

    every: int = Field(default=10, ge=0)
    keep: int = Field(default=2, ge=1)
    resume: bool = True


class StoreSettings(BaseModel):
    """Where the run's rollouts, spans and resources are kept.

    Attributes:
        url: the store; None means SQLite at `<run_dir>/store.db`.
        token: the bearer token of an `http(s)://` url (a `reinforge store serve` server); None
            reads `$REINFORGE_STORE_TOKEN`.
    """

    model_config = ConfigDict(extra="forbid")

    url: str | None = None
    token: SecretStr | None = None


MOVED: dict[str, str] = {
    "learning_rate": "optim.learning_rate",
    "lr_schedule": "optim.lr_schedule",
    "lr_final_ratio": "optim.lr_final_ratio",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.max_grad_norm",
    "epochs_per_batch": "optim.epochs_per_batch",
    "micro_batch_tokens": "optim.micro_batch_tokens",
    "lora": "optim.lora",
    "tasks_per_step": "rollouts.tasks_per_step",
    "temperature": "rollouts.temperature",
    "max_tokens": "rollouts.max_tokens",
    "rollout_timeout_s": "rollouts.timeout_s",
    "step_timeout_s": "rollouts.step_timeout_s",
    "runners": "runners.count",
    "runner_concurrency": "runners.concurrency",
    "runner_processes": "runners.processes",
    "runner_processes_nice": "runners.processes_nice",
    "engine_max_batch_size": "engine.max_batch_size",
    "engine_max_seq_len": "engine.max_seq_len",
    "engine_process": "engine.process",
    "max_steps": "schedule.max_steps",
    "max_minutes": "schedule.max_minutes",
    "val_every": "schedule.val_every",
    "val_greedy": "schedule.val_greedy",
    "prefetch_rollouts": "schedule.prefetch_rollouts",
    "overlap_rollouts": "schedule.overlap_rollouts",
    "checkpoint_every": "checkpoints.every",
    "keep_checkpoints": "checkpoints.keep",
    "resume": "checkpoints.resume",
    "store_url": "store.url",
    "store_token": "store.token",
}
"""Each flat setting of the earlier `TrainerConfig` and the group field it is now."""


class TrainerConfig(BaseModel):
    """How a Trainer runs: the run's identity, then one group per concern (see the module docstring).

    Attributes:
        run_dir: where the store database, checkpoints, metrics and the reward curve go.
        seed: seeds data order, sampling and initialisation, so a run is reproducible.
        progress: show a progress bar on the terminal.
        optim: the policy update (`OptimSettings`).
        rollouts: what one step samples (`RolloutSettings`).
        runners: who runs the agents (`RunnerSettings`).
        engine: the embedded engine (`EngineSettings`).
        schedule: steps, time budget, validation and rollout scheduling (`ScheduleSettings`).
        checkpoints: how often, how many, and whether to resume (`CheckpointSettings`).
        store: where the store is (`StoreSettings`).
    """

    model_config = ConfigDict(extra="forbid")

    run_dir: Path = Path("runs/latest")
    seed: int = 0
    progress: bool = True
    optim: OptimSettings = Field(default_factory=OptimSettings)
    rollouts: RolloutSettings = Field(default_factory=RolloutSettings)
    runners: RunnerSettings = Field(default_factory=RunnerSettings)
    engine: EngineSettings = Field(default_factory=EngineSettings)
    schedule: ScheduleSettings = Field(default_factory=ScheduleSettings)
    checkpoints: CheckpointSettings = Field(default_factory=CheckpointSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)

    @model_validator(mode="before")
    @classmethod
    def _refuse_flat_settings(cls, data: Any) -> Any:
        """Name where an old flat setting went (`runners` is both: a count before, a group now)."""
        if not isinstance(data, dict):
            return data
        moved = [
            key
            for key in data
            if key in MOVED and not (key == "runners" and not isinstance(data[key], int | float))
        ]
        if moved:
            where = "; ".join(f"{key} is now {MOVED[key]}" for key in moved)
            tables = sorted({f"[trainer.{MOVED[key].split('.')[0]}]" for key in moved})
            raise ValueError(
                f"trainer settings are grouped: {where} "
                f"(in a TOML file, under {', '.join(tables)}; see docs/training.md)"
            )
        return data

    @property
    def store_location(self) -> str:
        return self.store.url or f"sqlite:///{(self.run_dir / 'store.db').resolve()}"
