"""The trainer's settings: one validated object made of groups, also readable from a TOML file.

`TrainerConfig` holds what identifies a run (`run_dir`, `seed`, `progress`) and one sub-model per
concern, each handed as an object to the part that uses it: `optim` to the `Policy`, `engine` to the
serving stack, `runners` to its start, `schedule` to the rollout scheduler. In a TOML run file the
groups are sub-tables of `[trainer]`: `[trainer.optim]`, `[trainer.rollouts]`, `[trainer.runners]`,
`[trainer.engine]`, `[trainer.schedule]`, `[trainer.checkpoints]`, `[trainer.store]`,
`[trainer.compute]`, `[trainer.distributed]`, `[trainer.serve]`, `[trainer.logging]`.

A setting written the flat way of earlier versions (`learning_rate` directly under `[trainer]`) still
works until it is removed, with a DeprecationWarning naming its group (`flat_settings`).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from reinforge.inference.run_sampling import RunSampling, SamplingOwner
from reinforge.stack.settings import EngineSettings
from reinforge.training.flat_settings import upgrade_flat_settings
from reinforge.training.metric_sinks.settings import LoggingSettings

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
    base_dtype: Literal["float32", "compute"] = "float32"
    """"compute": the frozen base weights of the adapted layers are kept in the update's compute
    precision (bfloat16 under bf16 autocast) instead of float32. Autocast casts them there in every
    forward anyway, but it caches casts of trainable weights only, so each forward pass kept a fresh
    bf16 copy of every frozen weight for its backward; the forward and the gradients are the same,
    and the base takes half the memory. The engine's merged weights are then rounded once from the
    bf16 base plus the float32 adapter delta instead of from the float32 base."""

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
        top_p: nucleus sampling of training rollouts (1: none).
        top_k: top-k sampling of training rollouts (0: none).
        max_tokens: the most tokens one LLM call may generate (given to the agent as a resource).
        sampling: who decides how calls are sampled. "run" (the default): the gateway applies the
            settings above (greedy for greedy validation) to every call, whatever the agent asks,
            keeping an agent's max_tokens as a cap under the run's. "agent": each call is sampled
            as the agent asks; the policy is still trained at the settings above, and truncated
            importance sampling corrects for the agent's own.
        timeout_s: the most one attempt may take.
        step_timeout_s: the most one step's rollouts may take before the stragglers are cancelled.
    """

    model_config = ConfigDict(extra="forbid")

    tasks_per_step: int = Field(default=16, ge=1)
    temperature: float = Field(default=1.0, gt=0, le=10.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    max_tokens: int = Field(default=64, ge=1)
    timeout_s: float = Field(default=120.0, gt=0)
    step_timeout_s: float = Field(default=600.0, gt=0)
    sampling: SamplingOwner = "run"

    def sampling_at(self, temperature: float) -> RunSampling:
        """The sampling of a phase at `temperature`: training's (and sampled validation's) at the
        rollouts' temperature, greedy validation's at 0 (which has no truncation)."""
        return RunSampling(
            temperature=temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            max_tokens=self.max_tokens,
            owner=self.sampling,
        )


class RaySettings(BaseModel):
    """Runner actors on a Ray cluster (`reinforge.runner.ray_runners`), each leasing from the run's
    store over HTTP; a dead actor's attempts retry through their leases.

    Attributes:
        address: the cluster: "auto" (the one `ray start` began on this machine), "HOST:PORT" of its
            head, or "ray://HOST:PORT" (Ray Client). The actors must reach the trainer's store, so a
            cluster beyond this machine needs `serve` on an interface it can reach.
        actors: runner actors to start; each runs up to `runners.concurrency` attempts at once.
        cpus_per_actor: the CPUs Ray reserves for each actor (it places them by this).
    """

    model_config = ConfigDict(extra="forbid")

    address: str = "auto"
    actors: int = Field(default=2, ge=1)
    cpus_per_actor: float = Field(default=1.0, ge=0)


class ServeSettings(BaseModel):
    """Serve the run's store and gateway where runners on other machines can join.

    The store token and the gateway secret come from `$REINFORGE_STORE_TOKEN` and
    `$REINFORGE_GATEWAY_SECRET` when set, else from `<run_dir>/store.token` and
    `<run_dir>/gateway.secret` (made with mode 0600); neither is ever put on a command line. The
    trainer prints the `reinforge runner` command that joins, reading both into its environment.

    Attributes:
        host: the interface to bind ("0.0.0.0": every interface).
        port: the port (0: any free one).
        public_url: the URL runners elsewhere use (default: `http://<host>:<port>`, this machine's
            name for a wildcard host); set it behind NAT or a proxy.
    """

    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)
    public_url: str | None = None


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
        ray: run the agents in runner actors on a Ray cluster instead (`RaySettings`); the agent must
            be importable by name there, as for `processes`.
        crash_loop_deaths, crash_loop_window_s: a runner child that dies is restarted (after a
            back-off) and its attempts retried; only this many deaths of one child within this many
            seconds stop the run, quoting the child's log (docs/reliability.md).

    `count = 0` (with no processes and no Ray) starts no runner at all: the run is then served
    (`serve`) and only runners that join from outside run its agents.
    """

    model_config = ConfigDict(extra="forbid")

    count: int = Field(default=1, ge=0)
    concurrency: int = Field(default=64, ge=1)
    processes: int = Field(default=0, ge=0)
    processes_nice: int = Field(default=10, ge=0, le=19)
    crash_loop_deaths: int = Field(default=5, ge=1)
    crash_loop_window_s: float = Field(default=60.0, gt=0)
    ray: RaySettings | None = None

    @model_validator(mode="after")
    def _one_kind_of_runner(self) -> RunnerSettings:
        if self.ray is not None and self.processes:
            raise ValueError("give runners.processes or runners.ray, not both")
        return self

    @property
    def slots(self) -> int:
        """Attempts all the trainer's own runners together run at once (joined runners not counted)."""
        if self.ray is not None:
            return self.ray.actors * self.concurrency
        return (self.processes or self.count) * self.concurrency

    @property
    def out_of_process(self) -> bool:
        """Whether the agents run outside the trainer's process (children or Ray actors)."""
        return self.processes > 0 or self.ray is not None


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
        max_staleness: asynchronous training with bounded staleness (docs/scaling.md). 0 (the
            default) is the synchronous schedule above. k >= 1 keeps up to k + 1 steps' worth of
            groups in flight, their calls never held, and trains each step on the first
            `tasks_per_step` complete groups, whichever step drew them; a transition sampled more
            than k versions before the one it would update is dropped and counted
            (`staleness/dropped`). The loss's `tis_cap` corrects the rest. Excludes
            `overlap_rollouts` and `prefetch_rollouts = true`.
    """

    model_config = ConfigDict(extra="forbid")

    max_steps: int = Field(default=100, ge=0)
    max_minutes: float | None = Field(default=None, gt=0)
    val_every: int = Field(default=10, ge=0)
    val_greedy: bool = True
    prefetch_rollouts: bool | None = None
    overlap_rollouts: bool = False
    max_staleness: int = Field(default=0, ge=0, le=64)

    @model_validator(mode="after")
    def _one_schedule(self) -> ScheduleSettings:
        if self.max_staleness > 0 and (self.overlap_rollouts or self.prefetch_rollouts):
            raise ValueError(
                "max_staleness > 0 is its own schedule: drop overlap_rollouts and prefetch_rollouts"
            )
        return self


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


class ComputeSettings(BaseModel):
    """Where the policy update (and the embedded engine beside it) computes, and in what precision.

    Attributes:
        device: "auto" (the GPU when torch sees one, else the CPU), "cpu", "cuda" or "cuda:N". With
            several training processes (`distributed.nproc`, torchrun), "auto" and "cuda" give each
            process its own GPU, `cuda:<LOCAL_RANK>`.
        dtype: "auto" (bfloat16 on CUDA, float32 on the CPU), "float32" or "bfloat16". With
            bfloat16 the update's forward passes run under bf16 autocast while the weights, their
            gradients and AdamW's state stay float32, and the embedded engine serves a bf16 copy.
        return_freed_memory: hand memory the update and the engine free back to the OS during the
            run (`reinforge.training.memory.returning_freed_memory`: glibc maps blocks of 1 MB and
            more one by one, and `malloc_trim` runs every second). Without it a long CPU run's RSS
            keeps the high-water mark of every phase. It sets glibc options for the whole process.
    """

    model_config = ConfigDict(extra="forbid")

    device: str = Field(default="auto", pattern=r"^(auto|cpu|cuda(:\d+)?)$")
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    return_freed_memory: bool = True


class DistributedSettings(BaseModel):
    """Data-parallel policy updates over torch.distributed (docs/distributed.md).

    Rank 0 runs the store, gateway, engine, runners, logging and checkpoints; every rank computes
    the gradient of its share of each step's transitions, and the gradients are summed.

    Attributes:
        nproc: training processes `reinforge train` starts on this machine (1: just this one). Under
            `torchrun` the launcher's WORLD_SIZE is used instead and this must be 1 or equal to it.
        backend: "auto" (NCCL on CUDA, gloo on the CPU), "nccl" or "gloo": how gradients travel.
            The step's transitions always travel over a gloo group (they are Python objects).
        timeout_minutes: how long a rank waits for the others. The other ranks wait while rank 0
            collects a step's rollouts and validates, so this bounds a step plus a validation.
        sharding: "replicate" (every rank holds the whole model and AdamW state) or "fsdp2"
            (`fully_shard` per decoder layer: each rank holds 1/N of the weights, gradients and
            AdamW state; full-model training without a value head only).
    """

    model_config = ConfigDict(extra="forbid")

    nproc: int = Field(default=1, ge=1)
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    timeout_minutes: float = Field(default=120.0, gt=0)
    sharding: Literal["replicate", "fsdp2"] = "replicate"


class TrainerConfig(BaseModel):
    """How a Trainer runs: the run's identity, then one group per concern (see the module docstring).

    Attributes:
        run_dir: where the store database, checkpoints, metrics and the reward curve go.
        seed: seeds data order, sampling and initialisation, so a run is reproducible.
        progress: show a progress bar on the terminal.
        optim: the policy update (`OptimSettings`).
        rollouts: what one step samples (`RolloutSettings`).
        runners: who runs the agents (`RunnerSettings`).
        engine: what serves the policy (`reinforge.stack.settings.EngineSettings`).
        schedule: steps, time budget, validation and rollout scheduling (`ScheduleSettings`).
        checkpoints: how often, how many, and whether to resume (`CheckpointSettings`).
        store: where the store is (`StoreSettings`).
        serve: serve the store and gateway for runners on other machines (`ServeSettings`); None
            keeps them on 127.0.0.1 with a secret only this process knows.
        compute: the update's device and precision (`ComputeSettings`).
        distributed: data-parallel updates over several processes (`DistributedSettings`).
        logging: where metrics go besides metrics.jsonl: TensorBoard, W&B, MLflow (`LoggingSettings`).
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
    serve: ServeSettings | None = None
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    distributed: DistributedSettings = Field(default_factory=DistributedSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @model_validator(mode="before")
    @classmethod
    def _upgrade_flat_settings(cls, data: Any) -> Any:
        """The deprecated flat settings, put in their groups with a warning (`flat_settings`)."""
        return upgrade_flat_settings(data, stacklevel=3) if isinstance(data, dict) else data

    @model_validator(mode="after")
    def _engine_serves_the_trained_policy(self) -> TrainerConfig:
        engine = self.engine
        if engine.backend not in ("embedded", "vllm", "sglang"):
            raise ValueError(
                f"engine.backend = {engine.backend!r} can't serve a policy in training: use 'embedded', "
                "'vllm' or 'sglang'"
            )
        if engine.model_dir is not None:
            raise ValueError(
                "engine.model_dir is for `reinforge store serve`: the trainer serves the model it trains"
            )
        if engine.upstream and engine.weights_dir is None:
            raise ValueError(
                f"engine.backend = {engine.backend!r} needs ['weights_dir']: a folder both the trainer and "
                "the server can read, where each new version's weights go (docs/upstream.md)"
            )
        if self.engine.sync == "lora":
            lora = self.optim.lora
            if lora is None:
                raise ValueError("engine.sync = 'lora' needs optim.lora (the adapter it hot-loads)")
            if lora.roles:
                raise ValueError(
                    "engine.sync = 'lora' hot-loads one shared adapter; per-role adapters (optim.lora.roles) "
                    "are served by the embedded engine only"
                )
        elif self.engine.backend != "embedded" and self.optim.lora is not None and self.optim.lora.roles:
            raise ValueError(
                "per-role adapters (optim.lora.roles) are served by the embedded engine only; "
                f"engine.backend = {self.engine.backend!r} would serve every role the same weights"
            )
        return self

    @model_validator(mode="after")
    def _someone_runs_the_agents(self) -> TrainerConfig:
        r = self.runners
        if r.count == 0 and not r.out_of_process and self.serve is None:
            raise ValueError(
                "runners.count = 0 starts no runner: set [trainer.serve] so runners can join from "
                "outside, or start runners (runners.count, runners.processes or runners.ray)"
            )
        return self

    @property
    def store_location(self) -> str:
        return self.store.url or f"sqlite:///{(self.run_dir / 'store.db').resolve()}"
