"""The training run every calc example shares: the demo's recipe, any agent, one RESULT line.

Each `<framework>_calc.py` defines its agent the way its framework's docs write it and calls
`train_calc(agent, "<name>")` from its `main()`; nothing here knows which framework the agent uses.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from reinforge import Agent
from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.tasks import train_tasks, val_tasks
from reinforge.demo.warm_start import load_warm_start
from reinforge.training import (
    CheckpointSettings,
    EngineSettings,
    FitResult,
    OptimSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    Trainer,
)


def merge_rate(fit: FitResult) -> float:
    """Calls merged onto the previous call's sample, over all calls that could have been."""
    merged = sum(r.get("credit/merged_calls", 0.0) for r in fit.history)
    mismatched = sum(r.get("credit/merge_mismatches", 0.0) for r in fit.history)
    return merged / (merged + mismatched) if merged + mismatched else 0.0


def train_calc(
    agents: Agent | dict[str, Agent], name: str, trained_roles: list[str] | None = None
) -> FitResult:
    """Parse the command line, train the agent on the calc tasks from the demo's warm start, and print
    `RESULT <name>_heldout before=<a> after=<b> merge_rate=<m>`.

    `agents` may offer variants by name (`--variant`); `trained_roles` trains only the LLM calls made
    by those roles (selective training of a multi-agent system)."""
    variants = agents if isinstance(agents, dict) else {name: agents}
    parser = argparse.ArgumentParser(description=f"Train the {name} calc agent with RL on CPU.")
    parser.add_argument("--variant", choices=sorted(variants), default=next(iter(variants)))
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / name.replace("_", "-"))
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--runner-processes", type=int, default=2)
    parser.add_argument("--val-size", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)

    model, tokenizer = load_warm_start()  # the demo's shipped 1.1M-parameter warm start
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=8, loss_agg="seq-mean-token-mean", seq_unit="rollout"),
        credit=CreditConfig(mode="merged", assignment="equal+air", agents=trained_roles),
        run_dir=args.run_dir,
        optim=OptimSettings(learning_rate=5e-4, lr_schedule="linear"),
        rollouts=RolloutSettings(tasks_per_step=16, max_tokens=48),
        runners=RunnerSettings(concurrency=128, processes=args.runner_processes),
        engine=EngineSettings(max_batch_size=128),
        schedule=ScheduleSettings(max_steps=args.max_steps, max_minutes=args.minutes),
        checkpoints=CheckpointSettings(every=5),
    )
    fit = trainer.fit(variants[args.variant], train_tasks(), val_tasks(args.val_size))
    print(
        f"RESULT {name}_heldout "
        f"before={fit.val_before.get('val/success', float('nan')):.3f} "
        f"after={fit.val_after.get('val/success', float('nan')):.3f} "
        f"merge_rate={merge_rate(fit):.3f}"
    )
    return fit
