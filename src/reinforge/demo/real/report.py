"""What the real-model demo prints: held-out success, the per-step time split, peak memory, and the
`RESULT real_demo_heldout ...` line benchmarks read."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel

from reinforge.training.trainer import FitResult


class StepSplit(BaseModel):
    """Mean seconds per RL step, by phase.

    `generate` is the collect phase: the agents' episodes on the engine, with each finished
    rollout's credit built while the others still run; `credit` is what is left after the last
    rollout ends (advantages, and the transitions' record once the update is done).
    """

    steps: int
    step: float
    generate: float
    credit: float
    update: float
    publish: float

    @classmethod
    def of(cls, history: Sequence[dict[str, Any]]) -> StepSplit:
        steps = [r for r in history if "time/step_s" in r]

        def mean(*keys: str) -> float:
            return sum(sum(float(r.get(k, 0.0)) for k in keys) for r in steps) / len(steps) if steps else 0.0

        return cls(
            steps=len(steps),
            step=mean("time/step_s"),
            generate=mean("time/collect_s"),
            credit=mean("time/advantages_s", "time/transitions_s"),
            update=mean("time/update_s"),
            publish=mean("time/publish_s"),
        )

    def describe(self) -> str:
        return (
            f"{self.step:.1f} s/step = generate {self.generate:.1f} + credit {self.credit:.2f} "
            f"+ update {self.update:.1f} + publish {self.publish:.2f} (means over {self.steps} steps)"
        )


class RealDemoResult(BaseModel):
    """The figures of one run."""

    before: float
    after: float
    greedy_before: float
    greedy_after: float
    rl_minutes: float
    steps: int
    split: StepSplit
    peak_rss_gb: float

    @classmethod
    def of(cls, fit: FitResult, peak_rss_bytes: int) -> RealDemoResult:
        nan = float("nan")
        return cls(
            before=fit.val_before.get("val/success", nan),
            after=fit.val_after.get("val/success", nan),
            greedy_before=fit.val_before.get("val/greedy_success", nan),
            greedy_after=fit.val_after.get("val/greedy_success", nan),
            rl_minutes=fit.rl_seconds / 60,
            steps=fit.steps,
            split=StepSplit.of(fit.history),
            peak_rss_gb=peak_rss_bytes / 1e9,
        )

    def result_line(self) -> str:
        return (
            "RESULT real_demo_heldout "
            f"before={self.before:.3f} after={self.after:.3f} "
            f"greedy_before={self.greedy_before:.3f} greedy_after={self.greedy_after:.3f} "
            f"rl_minutes={self.rl_minutes:.2f} steps={self.steps}"
        )
