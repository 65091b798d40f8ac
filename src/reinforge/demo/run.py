"""`reinforge demo`: train the calc agent through the store, gateway, engine and runners, and report
held-out success.

Store (SQLite in the run folder) + store server with the gateway mounted + embedded engine + runners:
the same path any user agent takes. The result line is what benchmarks and CI read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
import transformers
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.agent import calc_agent
from reinforge.demo.tasks import train_tasks, val_tasks
from reinforge.demo.warm_start import SHIPPED_WARM_START, WarmStartConfig, build_warm_start, load_warm_start
from reinforge.training.config import (
    CheckpointSettings,
    ComputeSettings,
    EngineSettings,
    OptimSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    TrainerConfig,
)
from reinforge.training.trainer import FitResult, Trainer


class DemoSettings(BaseModel):
    """The demo's budget and hyper-parameters (the defaults are the published run)."""

    model_config = ConfigDict(extra="forbid")

    run_dir: Path = Path("runs/demo")
    rebuild_warm_start: bool = False
    minutes: float = Field(default=5.0, gt=0)
    max_steps: int = Field(default=400, ge=0)
    tasks_per_step: int = Field(default=16, ge=1)
    group_size: int = Field(default=8, ge=2)
    learning_rate: float = Field(default=5e-4, gt=0)
    lr_schedule: Literal["constant", "linear", "cosine"] = "linear"
    """Decayed to a tenth by the end of the budget: the final policy is then not caught mid-stride
    (docs/training.md compares it with a constant rate)."""
    val_size: int = Field(default=200, ge=1)
    val_every: int = Field(default=0, ge=0)
    checkpoint_every: int = Field(default=5, ge=0)
    credit_mode: Literal["merged", "per_call"] = "merged"
    runner_processes: int = Field(default=2, ge=0)
    """The agents run in this many `reinforge runner` children (0: in the trainer's process): their
    Python then runs beside the trainer's, and more steps fit in the budget (docs/training.md)."""
    seed: int = 0
    progress: bool = True
    compute: ComputeSettings = Field(default_factory=ComputeSettings)
    """The update's and the engine's device and precision (`benchmarks/gpu/train_calc_gpu.py` sets CUDA)."""


@dataclass
class DemoResult:
    fit: FitResult
    warm_start: Path

    def result_line(self) -> str:
        before, after = self.fit.val_before, self.fit.val_after
        return (
            "RESULT demo_heldout_success "
            f"before={before.get('val/success', float('nan')):.3f} "
            f"after={after.get('val/success', float('nan')):.3f} "
            f"greedy_before={before.get('val/greedy_success', float('nan')):.3f} "
            f"greedy_after={after.get('val/greedy_success', float('nan')):.3f} "
            f"rl_minutes={self.fit.rl_seconds / 60:.2f}"
        )


def prepare_warm_start(settings: DemoSettings, console: Console) -> Path:
    """The warm start to train from: rebuilt into the run folder when asked (and then reused), else
    the copy shipped with reinforge."""
    cached = settings.run_dir / "warm_start"
    if settings.rebuild_warm_start:
        recipe = WarmStartConfig(seed=settings.seed)
        steps = sum(phase.sft.steps for phase in recipe.sft_phases)
        console.print(f"building the warm start ({steps} SFT steps) into {cached} ...")
        started = time.monotonic()
        report = build_warm_start(cached, recipe)
        console.print(
            f"warm start built in {time.monotonic() - started:.0f}s: "
            f"loss {report.first_loss:.2f} -> {report.last_loss:.3f}"
        )
        return cached
    if (cached / "config.json").is_file():
        return cached
    return SHIPPED_WARM_START


def run_demo(settings: DemoSettings | None = None, console: Console | None = None) -> DemoResult:
    settings = settings or DemoSettings()
    console = console or Console()
    torch.set_num_threads(1)  # one thread per process: two stalled badly on a shared 2-core machine
    transformers.utils.logging.disable_progress_bar()  # keep the demo's output to what it reports
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    warm = prepare_warm_start(settings, console)
    model, tokenizer = load_warm_start(warm)
    console.print(
        f"calc demo: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M-parameter Llama from {warm}; "
        f"GRPO {settings.tasks_per_step} tasks x {settings.group_size} per step, "
        f"{settings.minutes:g} min budget, agents in "
        + (f"{settings.runner_processes} runner processes" if settings.runner_processes else "this process")
    )
    trainer = Trainer(
        model,
        tokenizer,
        # Each rollout weighs the same in the loss, however many tokens it has: with token-mean, long
        # failed rollouts out-voted short successful ones and pushed the policy into long garbage
        # (docs/training.md, "Collapses").
        algorithm=GRPO(group_size=settings.group_size, loss_agg="seq-mean-token-mean", seq_unit="rollout"),
        credit=CreditConfig(mode=settings.credit_mode, assignment=("equal", "air")),
        config=TrainerConfig(
            run_dir=settings.run_dir,
            seed=settings.seed,
            progress=settings.progress,
            optim=OptimSettings(learning_rate=settings.learning_rate, lr_schedule=settings.lr_schedule),
            rollouts=RolloutSettings(tasks_per_step=settings.tasks_per_step, max_tokens=48),
            runners=RunnerSettings(concurrency=128, processes=settings.runner_processes),
            engine=EngineSettings(max_batch_size=128),
            schedule=ScheduleSettings(
                max_steps=settings.max_steps, max_minutes=settings.minutes, val_every=settings.val_every
            ),
            checkpoints=CheckpointSettings(every=settings.checkpoint_every),
            compute=settings.compute,
        ),
    )
    fit = trainer.fit(calc_agent, train_tasks(seed=settings.seed), val_tasks(settings.val_size))
    result = DemoResult(fit=fit, warm_start=warm)
    before, after = fit.val_before, fit.val_after
    console.print(
        f"held-out success over {settings.val_size} tasks: sampled "
        f"{before.get('val/success', 0):.3f} -> {after.get('val/success', 0):.3f}, greedy "
        f"{before.get('val/greedy_success', 0):.3f} -> {after.get('val/greedy_success', 0):.3f} "
        f"({fit.steps} steps, {fit.rl_seconds / 60:.1f} min of RL"
        + (f", resumed from step {fit.resumed_from})" if fit.resumed_from is not None else ")")
    )
    console.print(
        f"run folder: {fit.run_dir.resolve()} (metrics.jsonl, tensorboard/, checkpoints/, store.db)"
    )
    if fit.curve is not None:
        console.print(f"reward curve: {fit.curve.resolve()}")
    console.print(
        f"dashboard: it was live at {fit.dashboard_url} during training; browse the run again with "
        f"`reinforge store serve --run-dir {fit.run_dir}`"
    )
    return result
