"""Train the calc agent from Python: the same run as `reinforge demo`, spelled out.

.venv/bin/python examples/calc/train.py [--run-dir runs/calc-py] [--minutes 5]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.agent import calc_agent
from reinforge.demo.tasks import train_tasks, val_tasks
from reinforge.demo.warm_start import load_warm_start
from reinforge.training import (
    CheckpointSettings,
    EngineSettings,
    OptimSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    Trainer,
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--run-dir", type=Path, default=Path("runs/calc-py"))
    parser.add_argument("--minutes", type=float, default=5.0)
    args = parser.parse_args()
    torch.set_num_threads(1)

    model, tokenizer = load_warm_start()  # the shipped 1.1M-parameter warm start
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=8, loss_agg="seq-mean-token-mean"),
        credit=CreditConfig(mode="merged", assignment="equal+air"),
        run_dir=args.run_dir,
        optim=OptimSettings(learning_rate=5e-4, lr_schedule="linear"),
        rollouts=RolloutSettings(tasks_per_step=16, max_tokens=48),
        runners=RunnerSettings(concurrency=128, processes=2),
        engine=EngineSettings(max_batch_size=128),
        schedule=ScheduleSettings(max_steps=400, max_minutes=args.minutes),
        checkpoints=CheckpointSettings(every=5),
    )
    result = trainer.fit(calc_agent, train_tasks(), val_tasks())
    print(f"held-out success before {result.val_before} after {result.val_after}")
    print(f"run folder {result.run_dir}, reward curve {result.curve}")


if __name__ == "__main__":
    main()
