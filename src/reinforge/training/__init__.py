"""Training: the RL loop (`Trainer.fit`), the policy update, checkpoints, metrics, the SFT warm start.

trainer = reinforge.training.Trainer(model=m, tokenizer=tok, algorithm=GRPO(group_size=8),
                                     credit=CreditConfig(mode="merged"), runners=1, max_steps=50)
result = trainer.fit(agent, train_dataset, val_dataset)
"""

from reinforge.training.config import LoraSettings, TrainerConfig
from reinforge.training.metrics import MetricsLog, plot_reward_curve
from reinforge.training.policy import Policy
from reinforge.training.sft import SftConfig, SftExample, render_conversation, supervised_finetune
from reinforge.training.trainer import FitResult, Trainer

__all__ = [
    "FitResult",
    "LoraSettings",
    "MetricsLog",
    "Policy",
    "SftConfig",
    "SftExample",
    "Trainer",
    "TrainerConfig",
    "plot_reward_curve",
    "render_conversation",
    "supervised_finetune",
]
