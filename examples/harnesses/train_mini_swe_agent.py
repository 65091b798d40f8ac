"""Train a model as mini-swe-agent's policy on the shipped Harbor tasks (docs/harnesses.md).

    pip install -e ".[harnesses,models]"
    python examples/harnesses/train_mini_swe_agent.py --steps 3

mini-swe-agent runs unchanged, one sandboxed attempt per rollout; the reward is the task's tests.
A 135M model does not fix code: on CPU this shows the path (calls recorded, merged, trained), not
learning. Point `--model` at a stronger checkpoint (and a GPU) for that.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.harnesses import HarnessAgent, MiniSweAgent, load_tasks
from reinforge.models import resolve_model
from reinforge.training import (
    EngineSettings,
    OptimSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    Trainer,
)

TASKS = Path(__file__).resolve().parent / "tasks"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a packaged model, folder or hub id")
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / "mini-swe-agent")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", nargs="*", default=["write-file", "fix-failing-test"])
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--harness-steps", type=int, default=3, help="mini-swe-agent's step limit")
    parser.add_argument("--reward", choices=["fraction", "all_or_nothing"], default="fraction")
    args = parser.parse_args()
    torch.set_num_threads(2)

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    run_dir = args.run_dir.resolve()
    agent = HarnessAgent(
        MiniSweAgent(step_limit=args.harness_steps),
        attempts_dir=run_dir / "attempts",
        tasks_root=TASKS,
        hide=[run_dir],  # the store token and the gateway secret live there
        reward_mode=args.reward,
        timeout_s=400,
    )
    tasks = [t.as_task() for t in load_tasks(TASKS) if t.name in args.tasks]
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=args.group_size),
        credit=CreditConfig(mode="merged", assignment="equal+air"),
        run_dir=run_dir,
        optim=OptimSettings(learning_rate=1e-6),
        # mini-swe-agent's system prompt and task are ~850 SmolLM2 tokens before the first reply.
        engine=EngineSettings(max_seq_len=4096),
        rollouts=RolloutSettings(tasks_per_step=len(tasks), max_tokens=96, timeout_s=600),
        runners=RunnerSettings(concurrency=len(tasks) * args.group_size),
        schedule=ScheduleSettings(max_steps=args.steps),
    )
    fit = trainer.fit(agent, tasks)
    last = fit.history[-1] if fit.history else {}
    print(
        f"RESULT mini_swe_agent_train steps={len(fit.history)} "
        f"reward={last.get('train/reward', float('nan')):.3f} "
        f"merged_calls={sum(r.get('credit/merged_calls', 0.0) for r in fit.history):.0f} "
        f"merge_mismatches={sum(r.get('credit/merge_mismatches', 0.0) for r in fit.history):.0f}"
    )


if __name__ == "__main__":
    main()
