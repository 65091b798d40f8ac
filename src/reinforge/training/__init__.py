"""Training: the RL loop (`Trainer.fit`), the policy update, checkpoints, metrics, the SFT warm start.

trainer = reinforge.training.Trainer(model=m, tokenizer=tok, algorithm=GRPO(group_size=8),
                                     credit=CreditConfig(mode="merged"), schedule={"max_steps": 50})
result = trainer.fit(agent, train_dataset, val_dataset)

The names load on first use: `reinforge.training.cli` is imported by every `reinforge` command, and
torch plus transformers take seconds to import, which `reinforge store serve` should not pay.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reinforge._lazy import lazy_names

if TYPE_CHECKING:
    from reinforge.training.config import (
        CheckpointSettings,
        ComputeSettings,
        DistributedSettings,
        EngineSettings,
        LoraSettings,
        OptimSettings,
        RolloutSettings,
        RunnerSettings,
        ScheduleSettings,
        StoreSettings,
        TrainerConfig,
    )
    from reinforge.training.metrics import MetricsLog, plot_reward_curve
    from reinforge.training.policy import Policy
    from reinforge.training.sft import SftConfig, SftExample, render_conversation, supervised_finetune
    from reinforge.training.trainer import FitResult, Trainer

_WHERE = {
    "CheckpointSettings": ".config",
    "ComputeSettings": ".config",
    "DistributedSettings": ".config",
    "EngineSettings": ".config",
    "FitResult": ".trainer",
    "LoraSettings": ".config",
    "OptimSettings": ".config",
    "RolloutSettings": ".config",
    "RunnerSettings": ".config",
    "ScheduleSettings": ".config",
    "StoreSettings": ".config",
    "MetricsLog": ".metrics",
    "Policy": ".policy",
    "SftConfig": ".sft",
    "SftExample": ".sft",
    "Trainer": ".trainer",
    "TrainerConfig": ".config",
    "plot_reward_curve": ".metrics",
    "render_conversation": ".sft",
    "supervised_finetune": ".sft",
}

__getattr__ = lazy_names(__name__, _WHERE)


__all__ = [
    "CheckpointSettings",
    "ComputeSettings",
    "DistributedSettings",
    "EngineSettings",
    "FitResult",
    "LoraSettings",
    "MetricsLog",
    "OptimSettings",
    "Policy",
    "RolloutSettings",
    "RunnerSettings",
    "ScheduleSettings",
    "SftConfig",
    "SftExample",
    "StoreSettings",
    "Trainer",
    "TrainerConfig",
    "plot_reward_curve",
    "render_conversation",
    "supervised_finetune",
]
