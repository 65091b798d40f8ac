"""The paper's three agents on the real SmolLM2-135M-Instruct: each `config_smollm2*.toml` trained in
turn with `reinforge train`'s own pieces, held-out figures before and after (sampled and greedy).

    PYTHONPATH=src .venv/bin/python benchmarks/paper_real_bench.py            # all four, 200 held out
    PYTHONPATH=src .venv/bin/python benchmarks/paper_real_bench.py --only calc_x \\
        --val-size 16 --max-steps 1 --minutes 3 --tasks-per-step 2 --group-size 4  # a reduced run
    PYTHONPATH=src .venv/bin/python -m reinforge sft examples/calc_x/config_smollm2.toml  # timed apart
    PYTHONPATH=src .venv/bin/python benchmarks/paper_real_bench.py --only calc_x --minutes 28

Prints, for each config, `RESULT paper_real_<name> before=<a> after=<b> greedy_before=<c>
greedy_after=<d> rl_minutes=<m> steps=<n> calls_per_episode=<k>`; before/after read the config's
`[report] metric` (success for sql and calc_x, mean answer F1 for rag); calls_per_episode is the
mean model calls per held-out episode after training (sampled validation). A config with a
`[warm_start]` section (every one now) starts RL from its warm start: built first when its folder is
missing or with `--rebuild-warm-start` (`reinforge sft`'s own code, timed on its own and printed as
`WARM_START paper_real_<name> minutes=<w> examples=<e> sft_steps=<s> loss=<a>-><b>`), so before is the
warm-started model. sql and sql_lora share one warm start folder: the second finds it built. Each
config ends with `MEMORY paper_real_<name> peak_rss_gb=<g>`: the highest summed RSS of this process
and its children (engine, trainer, store and the runner processes) while the config trains and
validates, sampled four times a second; the warm start's own peak is on its line.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from pathlib import Path
from typing import Any

from reinforge.training.memory import PeakTreeRss
from reinforge.training.run_config import RunConfig, load_dataset, load_model, load_run_config, resolve_agent
from reinforge.training.trainer import FitResult, Trainer

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
CONFIGS = {
    "sql": EXAMPLES / "sql" / "config_smollm2.toml",
    "sql_lora": EXAMPLES / "sql" / "config_smollm2_lora.toml",
    "rag": EXAMPLES / "rag" / "config_smollm2.toml",
    "calc_x": EXAMPLES / "calc_x" / "config_smollm2.toml",
}


def calls_per_episode(fit: FitResult) -> float:
    """Mean model calls per held-out episode after training (sampled validation; nan if not run).

    Read from the validation episodes (`val/calls`), not from the training steps' `credit/calls`:
    those count the calls of training episodes, at every policy along the way."""
    return float(fit.val_after.get("val/calls", math.nan))


def result_line(name: str, fit: FitResult, metric: str) -> str:
    """The `RESULT paper_real_<name> ...` line of one config's run."""
    before, after = fit.val_before, fit.val_after
    return (
        f"RESULT paper_real_{name} before={before.get(f'val/{metric}', math.nan):.3f} "
        f"after={after.get(f'val/{metric}', math.nan):.3f} "
        f"greedy_before={before.get(f'val/greedy_{metric}', math.nan):.3f} "
        f"greedy_after={after.get(f'val/greedy_{metric}', math.nan):.3f} "
        f"rl_minutes={fit.rl_seconds / 60:.2f} steps={fit.steps} "
        f"calls_per_episode={calls_per_episode(fit):.2f}"
    )


_REBUILT: set[Path] = set()
"""Warm start folders built by this run: sql and sql_lora share one, rebuilt once."""


def warm_start(name: str, cfg: RunConfig, rebuild: bool) -> str | None:
    """Build the config's warm start when it has one and its folder is missing (or `rebuild`): the
    `WARM_START` line, else None."""
    if cfg.warm_start is None:
        return None
    from reinforge.training.warm_start import build_warm_start

    out = cfg.warm_start.out_dir(cfg.base_dir).resolve()
    if (out / "config.json").is_file() and (not rebuild or out in _REBUILT):
        print(f"{name}: warm start {out} already built (--rebuild-warm-start builds it again)", flush=True)
        return None
    started = time.monotonic()
    with PeakTreeRss() as peak:
        report = asyncio.run(build_warm_start(cfg, recollect=rebuild))
    _REBUILT.add(out)
    return (
        f"WARM_START paper_real_{name} minutes={(time.monotonic() - started) / 60:.2f} "
        f"examples={report.examples} sft_steps={report.sft.steps} "
        f"loss={report.sft.first_loss:.3f}->{report.sft.last_loss:.3f} peak_rss_gb={peak.gigabytes:.2f}"
    )


def run_one(name: str, args: argparse.Namespace) -> tuple[str, float]:
    """The config's RESULT line and the peak GB of its run (warm start apart)."""
    overrides: dict[str, Any] = {
        "run_dir": Path(args.run_root) / name,
        "schedule": {
            "max_steps": args.max_steps,
            "val_greedy": True,
            **({"max_minutes": args.minutes} if args.minutes is not None else {}),
        },
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
    built = warm_start(name, cfg, args.rebuild_warm_start)
    if built is not None:
        print(built, flush=True)
    model, tokenizer = load_model(cfg)  # relative paths start at the config's folder
    trainer = Trainer(model, tokenizer, algorithm=algorithm, credit=cfg.credit, config=cfg.trainer)
    with PeakTreeRss() as peak:
        fit = trainer.fit(resolve_agent(cfg), train, val)
    metric = "success" if cfg.report.metric.endswith("success") else "reward"
    return result_line(name, fit, metric), peak.gigabytes


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", choices=list(CONFIGS), default=list(CONFIGS))
    parser.add_argument("--val-size", type=int, default=200, help="held-out tasks (>= 200 for a full run)")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument(
        "--minutes", type=float, default=None, help="RL budget per config (default: the config's max_minutes)"
    )
    parser.add_argument("--tasks-per-step", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--run-root", default="runs/paper-real")
    parser.add_argument(
        "--rebuild-warm-start", action="store_true", help="record and train the warm starts again"
    )
    args = parser.parse_args()
    for name in args.only:
        started = time.monotonic()
        line, peak_gb = run_one(name, args)
        print(f"{name}: {time.monotonic() - started:.0f}s in all", flush=True)
        print(line, flush=True)
        print(f"MEMORY paper_real_{name} peak_rss_gb={peak_gb:.2f}", flush=True)


if __name__ == "__main__":
    main()
