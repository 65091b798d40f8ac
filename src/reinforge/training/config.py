"""The trainer's settings: one validated object, also readable from the `[trainer]` table of a TOML file."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr


class LoraSettings(BaseModel):
    """Train low-rank adapters (peft) instead of every weight; the engine gets merged weights."""

    model_config = ConfigDict(extra="forbid")

    r: int = Field(default=8, ge=1)
    alpha: int = Field(default=16, ge=1)
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0)
    target_modules: list[str] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )


class TrainerConfig(BaseModel):
    """How a Trainer runs.

    Attributes:
        run_dir: where the store database, checkpoints, metrics and the reward curve go.
        store_url: the store; None means SQLite at `<run_dir>/store.db`.
        store_token: the bearer token of an `http(s)://` store_url (a `reinforge store serve`
            server); None reads `$REINFORGE_STORE_TOKEN`.
        max_steps: RL steps (policy updates) to run at most.
        max_minutes: stop after this much RL wall time (None: no time limit); validation time counts.
        tasks_per_step: distinct tasks per step; each runs `group_size` times (from the algorithm).
        learning_rate / weight_decay / max_grad_norm: the AdamW optimiser of the policy update.
        lr_schedule: "constant", or "linear" / "cosine" decay from `learning_rate` to
            `learning_rate * lr_final_ratio` over the run (its progress is the larger of steps done
            over `max_steps` and, with `max_minutes`, RL time spent over that budget), so the policy
            the run ends with is not caught mid-stride by a full-size step.
        epochs_per_batch: passes over one step's transitions (> 1 makes the PPO ratio and TIS matter).
        micro_batch_tokens: the most (padded) tokens in one forward/backward; gradients accumulate.
        temperature: the sampling temperature of training rollouts (and of "sampled" validation).
        max_tokens: the most tokens one LLM call may generate (given to the agent as a resource).
        val_every: validate every N steps (0: only before and after training).
        val_greedy: also validate with greedy decoding.
        checkpoint_every: checkpoint every N steps (0: only at the end); `resume` picks the latest.
        keep_checkpoints: how many checkpoints to keep on disk.
        runners: in-process runners; each runs up to `runner_concurrency` attempts at once.
        runner_processes: run the agents in this many `reinforge runner` child processes instead of
            in-process runners (each child runs up to `runner_concurrency` attempts). Agents' Python
            then runs beside the trainer's, not under its interpreter lock: on a machine with two
            or more cores this is the faster setting. The agent must be importable by name (a
            module-level function or class). 0 keeps the runners in this process.
        runner_processes_nice: how much lower the runner children's CPU priority is than the
            trainer's (added to their niceness, 0-19). While the engine generates a step, the
            children mostly prepare the next step's calls (`prefetch_rollouts`): on a machine with
            few cores the engine, on every step's critical path, should get the CPU first.
        rollout_timeout_s: the most one attempt may take.
        step_timeout_s: the most one step's rollouts may take before the stragglers are cancelled.
        lora: train LoRA adapters instead of the full model.
        seed: seeds data order, sampling and initialisation, so a run is reproducible.
        resume: continue from the latest checkpoint in run_dir when there is one.
        engine_max_batch_size: sequences the embedded engine decodes together.
        engine_max_seq_len: the longest prompt + completion the engine serves (sizes its KV cache).
        engine_process: run the embedded engine in its own child process (`EngineProcess`), so its
            scheduling loop does not share the interpreter lock with the gateway and store that
            answer the agents. Off by default: on a 2-core machine the CPU, not the lock, is what
            runs out, and a third busy process made `benchmarks/trainer_bench.py` slower (1.98
            against 2.32 steps/s); it is for machines with cores to spare.
        progress: show a progress bar on the terminal.
        prefetch_rollouts: start the next step's agents early (while this step generates when the
            runners have room for two steps' rollouts, else during the update); their LLM calls
            wait at the gateway until the updated weights are published, so every token is still
            sampled by the policy it trains (strictly on-policy). What an agent does before its
            first call, and the runners' leasing, then overlaps this step instead of delaying the
            next one. None (the default) prefetches with `runner_processes` only: in-process
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

    run_dir: Path = Path("runs/latest")
    store_url: str | None = None
    store_token: SecretStr | None = None
    max_steps: int = Field(default=100, ge=0)
    max_minutes: float | None = Field(default=None, gt=0)
    tasks_per_step: int = Field(default=16, ge=1)
    learning_rate: float = Field(default=3e-4, gt=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    lr_final_ratio: float = Field(default=0.1, ge=0, le=1)
    weight_decay: float = Field(default=0.0, ge=0)
    max_grad_norm: float | None = Field(default=1.0, gt=0)
    epochs_per_batch: int = Field(default=1, ge=1)
    micro_batch_tokens: int = Field(default=8192, ge=64)
    temperature: float = Field(default=1.0, gt=0)
    max_tokens: int = Field(default=64, ge=1)
    val_every: int = Field(default=10, ge=0)
    val_greedy: bool = True
    checkpoint_every: int = Field(default=10, ge=0)
    keep_checkpoints: int = Field(default=2, ge=1)
    runners: int = Field(default=1, ge=1)
    runner_concurrency: int = Field(default=64, ge=1)
    runner_processes: int = Field(default=0, ge=0)
    runner_processes_nice: int = Field(default=10, ge=0, le=19)
    rollout_timeout_s: float = Field(default=120.0, gt=0)
    step_timeout_s: float = Field(default=600.0, gt=0)
    lora: LoraSettings | None = None
    seed: int = 0
    resume: bool = True
    engine_max_batch_size: int = Field(default=64, ge=1)
    engine_max_seq_len: int = Field(default=512, ge=16)
    engine_process: bool = False
    progress: bool = True
    prefetch_rollouts: bool | None = None
    overlap_rollouts: bool = False

    def learning_rate_at(self, progress: float) -> float:
        """The scheduled learning rate when `progress` (0 to 1) of the run is done."""
        if self.lr_schedule == "constant":
            return self.learning_rate
        done = min(max(progress, 0.0), 1.0)
        left = 1.0 - done if self.lr_schedule == "linear" else 0.5 * (1.0 + math.cos(math.pi * done))
        return self.learning_rate * (self.lr_final_ratio + (1.0 - self.lr_final_ratio) * left)

    @property
    def store_location(self) -> str:
        return self.store_url or f"sqlite:///{(self.run_dir / 'store.db').resolve()}"
