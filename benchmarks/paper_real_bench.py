"""The paper's three agents on the real SmolLM2-135M-Instruct: each `config_smollm2*.toml` trained in
turn with `reinforge train`'s own pieces, held-out figures before and after (sampled and greedy).

    PYTHONPATH=src .venv/bin/python benchmarks/paper_real_bench.py            # all four, 200 held out
    PYTHONPATH=src .venv/bin/python benchmarks/paper_real_bench.py --only calc_x \\
        --val-size 16 --max-steps 1 --minutes 3 --tasks-per-step 2 --group-size 4  # a reduced run

Prints, for each config, `RESULT paper_real_<name> before=<a> after=<b> greedy_before=<c>
greedy_after=<d> rl_minutes=<m> steps=<n> calls_per_episode=<k>`; before/after read the config's
`[report] metric` (success for sql and calc_x, mean answer F1 for rag). No warm start: the configs
start from the packaged model with demonstrations in the prompt.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path
from typing import Any

from reinforge.training.run_config import load_dataset, load_run_config, resolve_agent
from reinforge.training.trainer import FitResult, Trainer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CONFIGS = {
    "sql": EXAMPLES / "sql" / "config_smollm2.toml",
    "sql_lora": EXAMPLES / "sql" / "config_smollm2_lora.toml",
    "rag": EXAMPLES / "rag" / "config_smollm2.toml",
    "calc_x": EXAMPLES / "calc_x" / "config_smollm2.toml",
}


def calls_per_episode(fit: FitResult, episodes_per_step: int) -> float:
    """Recorded LLM calls per training episode, over the run's steps (nan without a step)."""
    calls = sum(float(r.get("credit/calls", 0.0)) for r in fit.history if "credit/calls" in r)
    steps = sum(1 for r in fit.history if "credit/calls" in r)
    return calls / (steps * episodes_per_step) if steps else math.nan


def run_one(name: str, args: argparse.Namespace) -> str:
    overrides: dict[str, Any] = {
        "run_dir": Path(args.run_root) / name,
        "schedule": {"max_steps": args.max_steps, "max_minutes": args.minutes, "val_greedy": True},
    }
    if args.tasks_per_step is not None:
        overrides["rollouts"] = {"tasks_per_step": args.tasks_per_step}
    cfg = load_run_config(CONFIGS[name], overrides)
    algorithm = cfg.algorithm_config()
    if args.group_size is not None:
        algorithm = algorithm.model_copy(update={"group_size": args.group_size})
    assert cfg.data.val is not None and cfg.report is not None
    train = load_dataset(cfg.data.train, cfg.base_dir)
    val = load_dataset(cfg.data.val, cfg.base_dir)[: args.val_size]
    trainer = Trainer(cfg.model.path, algorithm=algorithm, credit=cfg.credit, config=cfg.trainer)
    fit = trainer.fit(resolve_agent(cfg), train, val)
    metric = "success" if cfg.report.metric.endswith("success") else "reward"
    before, after = fit.val_before, fit.val_after
    episodes = cfg.trainer.rollouts.tasks_per_step * int(getattr(algorithm, "group_size", 1))
    return (
        f"RESULT paper_real_{name} before={before.get(f'val/{metric}', math.nan):.3f} "
        f"after={after.get(f'val/{metric}', math.nan):.3f} "
        f"greedy_before={before.get(f'val/greedy_{metric}', math.nan):.3f} "
        f"greedy_after={after.get(f'val/greedy_{metric}', math.nan):.3f} "
        f"rl_minutes={fit.rl_seconds / 60:.2f} steps={fit.steps} "
        f"calls_per_episode={calls_per_episode(fit, episodes):.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--val-size", type=int, default=200, help="held-out tasks (>= 200 for a full run)")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--minutes", type=float, default=10.0, help="RL budget per config")
    parser.add_argument("--tasks-per-step", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--run-root", default="runs/paper-real")
    args = parser.parse_args()
    for name in args.only:
        started = time.monotonic()
        line = run_one(name, args)
        print(f"{name}: {time.monotonic() - started:.0f}s in all", flush=True)
        print(line, flush=True)


if __name__ == "__main__":
    main()
