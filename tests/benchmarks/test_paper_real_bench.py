"""`benchmarks/paper_real_bench.py`'s RESULT line: calls per episode come from the held-out episodes."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType

from reinforge.training.trainer import FitResult

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


def test_calls_per_episode_reads_the_held_out_episodes_after_training() -> None:
    bench = _load("paper_real_bench")
    fit = FitResult(
        run_dir=Path("runs/x"),
        steps=3,
        policy_version=3,
        rl_seconds=90.0,
        resumed_from=None,
        val_before={"val/success": 0.25, "val/greedy_success": 0.5, "val/calls": 1.0},
        val_after={"val/success": 0.5, "val/greedy_success": 0.75, "val/calls": 2.5, "val/greedy_calls": 3.0},
        # Training steps made other numbers of calls (64 episodes a step): never the figure reported.
        history=[{"step": s, "credit/calls": 64.0} for s in (1, 2, 3)],
    )
    line = bench.result_line("calc_x", fit, "success")
    assert line == (
        "RESULT paper_real_calc_x before=0.250 after=0.500 greedy_before=0.500 greedy_after=0.750 "
        "rl_minutes=1.50 steps=3 calls_per_episode=2.50"
    )
    del fit.val_after["val/calls"]
    assert bench.result_line("calc_x", fit, "success").endswith("calls_per_episode=nan")
