"""`reinforge demo --model smollm2-135m-instruct`: train the OpenAI-SDK calculator agent on a real
pretrained model through the store, gateway, embedded engine, runners and Trainer, and report
held-out success before and after.

The same path as the tiny demo (`reinforge.demo.run`) with a model the user brings: the packaged
model is converted once into the models cache (`reinforge models`), the gateway writes the tools
into the prompt in its default form (SmolLM2's template renders none), and the engine serves a bf16
copy while the update trains LoRA adapters under bf16 autocast (float32 on a CPU without native bf16).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

import torch
import transformers
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.real.agent import real_calc_agent
from reinforge.demo.real.report import RealDemoResult
from reinforge.demo.real.tasks import train_tasks, val_tasks
from reinforge.models import resolve_model
from reinforge.stack.settings import EngineSettings
from reinforge.training.config import (
    CheckpointSettings,
    ComputeSettings,
    LoraSettings,
    OptimSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    TrainerConfig,
)
from reinforge.training.device import native_bfloat16
from reinforge.training.memory import PeakTreeRss
from reinforge.training.trainer import Trainer


def default_compute() -> ComputeSettings:
    """bfloat16 where this CPU runs it natively (AMX or AVX512-BF16), float32 elsewhere: without them
    torch emulates bf16 matrix products and an update step takes several times longer (docs/demo.md)."""
    native = native_bfloat16(torch.device("cpu"))
    return ComputeSettings(device="cpu", dtype="bfloat16" if native else "float32")


class RealDemoSettings(BaseModel):
    """The real-model demo's budget and hyper-parameters (the defaults are the published run)."""

    model_config = ConfigDict(extra="forbid")

    model: str = "smollm2-135m-instruct"
    """A packaged model's name, a GGUF file, a model folder or a hub id (`reinforge models`)."""
    run_dir: Path = Path("runs/real-demo")
    minutes: float = Field(default=10.0, gt=0)
    max_steps: int = Field(default=60, ge=0)
    tasks_per_step: int = Field(default=8, ge=1)
    group_size: int = Field(default=8, ge=2)
    finetune: Literal["lora", "full"] = "lora"
    """LoRA keeps the run under 6 GB: full fine-tuning adds fp32 gradients and two AdamW moments
    (1.6 GB for 134.5M weights) and was not faster on this CPU (docs/demo.md)."""
    lora_rank: int = Field(default=16, ge=1)
    learning_rate: float = Field(default=3e-4, gt=0)
    max_tokens: int = Field(default=48, ge=8)
    """Tokens one call may generate: a calculator call is about 25, an answer about 8."""
    micro_batch_tokens: int = Field(default=2304, ge=256)
    """About half a GRPO group (4 rows of a ~400-token prompt and its episode), its prompt encoded
    once for them. A whole group's budget (4,608) also took a row of the next group, and so its
    prompt too: twice the activations for about 8% fewer tokens over the update (docs/demo.md)."""
    val_size: int = Field(default=200, ge=1)
    checkpoint_every: int = Field(default=0, ge=0)
    runner_processes: int = Field(default=1, ge=0)
    threads: int = Field(default=2, ge=1)
    compute: ComputeSettings = Field(default_factory=lambda: default_compute())
    """Where the update and the engine run (benchmarks/gpu/train_real_demo_gpu.py puts both on CUDA)."""
    seed: int = 0
    progress: bool = True


def trainer_config(settings: RealDemoSettings) -> TrainerConfig:
    """The Trainer's settings for the run."""
    lora = None
    if settings.finetune == "lora":
        # The frozen base in bf16: the same forward under bf16 autocast, without a bf16 copy of every
        # weight saved for each forward's backward (0.53 GB a micro-batch, docs/demo.md).
        lora = LoraSettings(r=settings.lora_rank, alpha=2 * settings.lora_rank, base_dtype="compute")
    return TrainerConfig(
        run_dir=settings.run_dir,
        seed=settings.seed,
        progress=settings.progress,
        optim=OptimSettings(
            learning_rate=settings.learning_rate, micro_batch_tokens=settings.micro_batch_tokens, lora=lora
        ),
        # The next step's agents start during the update and wait at the gateway for the new weights: the
        # attempt timeout must cover a whole update on 2 cores, or the whole prefetched step times out.
        rollouts=RolloutSettings(
            tasks_per_step=settings.tasks_per_step, max_tokens=settings.max_tokens, timeout_s=900.0
        ),
        runners=RunnerSettings(concurrency=128, processes=settings.runner_processes),
        engine=EngineSettings(max_batch_size=64, max_seq_len=768),
        schedule=ScheduleSettings(max_steps=settings.max_steps, max_minutes=settings.minutes, val_every=0),
        checkpoints=CheckpointSettings(every=settings.checkpoint_every),
        compute=settings.compute,
    )


def run_real_demo(settings: RealDemoSettings | None = None, console: Console | None = None) -> RealDemoResult:
    settings = settings or RealDemoSettings()
    console = console or Console()
    torch.set_num_threads(settings.threads)
    transformers.utils.logging.disable_progress_bar()
    settings.run_dir.mkdir(parents=True, exist_ok=True)
    with PeakTreeRss() as peak:  # the Trainer hands freed memory back (ComputeSettings)
        started = time.monotonic()
        folder = resolve_model(settings.model)
        console.print(f"model {settings.model}: {folder} (ready in {time.monotonic() - started:.1f}s)")
        trainer = Trainer(
            folder,
            algorithm=GRPO(
                group_size=settings.group_size, loss_agg="seq-mean-token-mean", seq_unit="rollout"
            ),
            credit=CreditConfig(mode="merged", assignment=("equal",)),
            config=trainer_config(settings),
        )
        params = sum(p.numel() for p in trainer.model.parameters())
        console.print(
            f"real-model demo: {params / 1e6:.1f}M parameters, {settings.finetune} fine-tuning, GRPO "
            f"{settings.tasks_per_step} tasks x {settings.group_size} per step, {settings.minutes:g} min RL "
            f"budget, {settings.val_size} held-out tasks"
        )
        fit = trainer.fit(real_calc_agent, train_tasks(seed=settings.seed), val_tasks(settings.val_size))
    result = RealDemoResult.of(fit, peak.bytes)
    console.print(
        f"held-out success over {settings.val_size} tasks: "
        f"sampled {result.before:.3f} -> {result.after:.3f}, "
        f"greedy {result.greedy_before:.3f} -> {result.greedy_after:.3f} "
        f"({result.steps} steps, {result.rl_minutes:.1f} min of RL)"
    )
    console.print(result.split.describe())
    console.print(f"peak RSS of the run's processes together: {result.peak_rss_gb:.2f} GB")
    console.print(f"run folder: {fit.run_dir.resolve()} (metrics.jsonl, store.db)")
    return result
