"""Train a model as mini-swe-agent's policy on the shipped Harbor tasks (docs/harnesses.md).

    pip install -e ".[harnesses,models]"
    python examples/harnesses/train_mini_swe_agent.py --model smollm2-135m-instruct --steps 3

mini-swe-agent runs unchanged, one sandboxed attempt per rollout; the reward is the task's tests.
A 135M model does not fix code: on CPU this shows the path (calls recorded, merged, trained), not
learning. Point `--model` at a stronger checkpoint (and a GPU) for that.

For SmolLM2 (`--format auto` picks it from the model's name) mini-swe-agent gets the `plain-bash`
action format (a ```bash block, a worked example in the task prompt: docs/harnesses.md, "mini-swe-agent
on SmolLM2"), tasks whose tests give partial credit, and REINFORCE++ normalised over the whole batch,
so that rollouts scoring alike within their task still get an advantage.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from reinforge.algorithms import GRPO, RLOO, Algorithm, ReinforcePlusPlus
from reinforge.credit import CreditConfig
from reinforge.harnesses import PLAIN_BASH, HarnessAgent, MiniSweAgent, load_tasks
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
SMALL_MODEL_TASKS = ["write-file", "edit-json-config", "make-script-executable"]
"""Tasks with two or three tests each: partial credit ("fraction") a small model can reach by one
command, and different starting scores (edit-json-config passes one of three as shipped)."""


def _algorithm(name: str, group_size: int) -> Algorithm:
    if name == "grpo":
        return GRPO(group_size=group_size)
    if name == "rloo":
        return RLOO(group_size=group_size)
    return ReinforcePlusPlus(group_size=group_size, baseline="none")


def _is_small(model: str) -> bool:
    return "smollm2" in model.lower()


def _weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def _distance(model: torch.nn.Module, before: list[torch.Tensor]) -> float:
    """L2 norm of the change of every weight: > 0 means an update reached the model."""
    total = sum(
        float((p.detach() - b).double().pow(2).sum()) for p, b in zip(model.parameters(), before, strict=True)
    )
    return math.sqrt(total)


def _step_line(record: dict[str, Any]) -> str:
    return (
        f"step {int(record.get('step', 0))}: calls={record.get('credit/calls', 0):.0f} "
        f"transitions={record.get('credit/transitions', 0):.0f} "
        f"merged_transitions={record.get('credit/merged_transitions', 0):.0f} "
        f"merge_rate={record.get('credit/merge_rate', 0.0):.2f} "
        f"reward={record.get('train/reward', float('nan')):.3f} "
        f"adv_absmax={max(abs(record.get('adv/min', 0.0)), abs(record.get('adv/max', 0.0))):.2f} "
        f"trained_tokens={record.get('credit/trained_tokens', 0):.0f} "
        f"seconds={record.get('time/step_s', float('nan')):.1f} "
        + " ".join(
            f"{key.removeprefix('credit/')}={value:.0f}"
            for key, value in sorted(record.items())
            if key.startswith("credit/merge_mismatch/")
        )
    ).rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="a packaged model, folder or hub id")
    parser.add_argument("--run-dir", type=Path, default=Path("runs") / "mini-swe-agent")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks", nargs="*", default=None, help="task folders' names (default per model)")
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--harness-steps", type=int, default=3, help="mini-swe-agent's step limit")
    parser.add_argument("--reward", choices=["fraction", "all_or_nothing"], default="fraction")
    parser.add_argument(
        "--format",
        choices=["auto", "mswea", "plain-bash"],
        default="auto",
        help="mini-swe-agent's reply format: its own (mswea), or plain-bash; auto: plain-bash for SmolLM2",
    )
    parser.add_argument(
        "--algorithm",
        choices=["auto", "grpo", "rloo", "reinforce_pp"],
        default="auto",
        help="auto: reinforce_pp (batch baseline) for SmolLM2, else grpo",
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--temperature", type=float, default=None, help="default 0.7 for SmolLM2, else 1.0")
    args = parser.parse_args()
    torch.set_num_threads(2)
    small = _is_small(args.model)
    plain = args.format == "plain-bash" or (args.format == "auto" and small)
    algorithm_name = args.algorithm if args.algorithm != "auto" else ("reinforce_pp" if small else "grpo")
    task_names = (
        args.tasks
        if args.tasks is not None
        else (SMALL_MODEL_TASKS if small else ["write-file", "fix-failing-test"])
    )

    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    run_dir = args.run_dir.resolve()
    agent = HarnessAgent(
        MiniSweAgent(step_limit=args.harness_steps, action_format=PLAIN_BASH if plain else None),
        attempts_dir=run_dir / "attempts",
        tasks_root=TASKS,
        hide=[run_dir],  # the store token and the gateway secret live there
        reward_mode=args.reward,
        timeout_s=400,
    )
    tasks = [t.as_task() for t in load_tasks(TASKS) if t.name in task_names]
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=_algorithm(algorithm_name, args.group_size),
        credit=CreditConfig(mode="merged", assignment="equal+air"),
        run_dir=run_dir,
        # A merged attempt is ~1,500 tokens; with SmolLM2's 49k-token vocabulary the logits of an
        # 8,192-token micro-batch (the default) and their gradients took 17 GB on CPU.
        optim=OptimSettings(learning_rate=1e-6, micro_batch_tokens=2048),
        # mini-swe-agent's own system prompt and task are ~850 SmolLM2 tokens before the first reply.
        engine=EngineSettings(max_seq_len=4096),
        rollouts=RolloutSettings(
            tasks_per_step=len(tasks),
            max_tokens=args.max_tokens,
            temperature=args.temperature or (0.7 if small else 1.0),
            timeout_s=600,
        ),
        runners=RunnerSettings(concurrency=len(tasks) * args.group_size),
        schedule=ScheduleSettings(max_steps=args.steps),
    )
    before = _weights(model)
    started = time.monotonic()
    fit = trainer.fit(agent, tasks)
    minutes = (time.monotonic() - started) / 60
    steps = [r for r in fit.history if "train/reward" in r]
    for record in steps:
        print(_step_line(record))

    def total(key: str) -> float:
        return sum(float(r.get(key, 0.0)) for r in steps)

    attempted = total("credit/merged_calls") + total("credit/merge_mismatches")
    merge_rate = total("credit/merged_calls") / attempted if attempted else 0.0
    print(
        f"weights changed by {_distance(model, before):.3g} (L2); advantages nonzero in "
        f"{sum(1 for r in steps if r.get('adv/std', 0.0) > 0)}/{len(steps)} steps; "
        f"algorithm={algorithm_name} format={'plain-bash' if plain else 'mswea'}"
    )
    last = steps[-1] if steps else {}
    print(
        f"RESULT mini_swe_agent_train steps={len(steps)} "
        f"reward={last.get('train/reward', float('nan')):.3f} "
        f"merged_calls={total('credit/merged_calls'):.0f} "
        f"merge_mismatches={total('credit/merge_mismatches'):.0f}"
    )
    print(
        f"RESULT msa_{'smollm2' if small else 'model'}_fit steps={len(steps)} "
        f"calls={total('credit/calls'):.0f} "
        f"merged_transitions={total('credit/merged_transitions'):.0f} merge_rate={merge_rate:.2f} "
        f"trained_tokens={total('credit/trained_tokens'):.0f} minutes={minutes:.1f}"
    )


if __name__ == "__main__":
    main()
