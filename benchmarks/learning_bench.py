"""Does the calc agent learn, and does it learn as well with per-call transitions as with merged ones?

The demo task (`reinforge demo`: the calc agent, its warm start, GRPO 16 tasks x 8 per step) trained
under the same RL budget (the same number of policy updates, each on the same number of rollouts,
from the same weights and seed) four ways:

    per_call / equal        one transition per LLM call (the paper's decomposition), final reward to each
    per_call / equal+air    ... plus Automatic Intermediate Rewards (calculator errors, malformed calls)
    merged   / equal        consecutive calls merged along exact token prefixes, tool results masked
    merged   / equal+air

Every run goes through the product's full path (`reinforge.training.Trainer.fit`: store, gateway,
engine, runners) and reports held-out success before and after (sampled at the training
temperature, and greedy), the training curve, and the numbers that show a collapse early (policy
entropy, clip fraction, groups whose rollouts all scored the same). `--ablation` adds a per-call run
with the loss normalised per transition (`loss_agg="seq-mean-token-mean"`, `seq_unit="transition"`),
the normalisation under which per-call training used to collapse, for comparison.

The last line is `RESULT percall_after=<x> merged_after=<y>`: held-out sampled success after
training, for the equal+air credit the demo uses.

    .venv/bin/python benchmarks/learning_bench.py              # 20 steps per run, 200 held-out tasks
    .venv/bin/python benchmarks/learning_bench.py --quick      # 2 steps of 8 tasks x 4, smoke run
    .venv/bin/python benchmarks/learning_bench.py --temperature 0.7   # trained and validated at 0.7

At temperature 1 the learning rate is constant. At any other temperature the defaults are 30 steps
and the demo's schedule, the rate decayed linearly to a tenth over the run (`reinforge demo`'s
`lr_schedule`): below 1 the same step of the weights moves the tempered log-probabilities 1/T times
as far, and a constant rate leaves the last policy caught mid-stride (docs/algorithms.md,
"Learning at another temperature"). `--steps` and `--lr-schedule` override either. Each RESULT line
is one run of one seed, as at temperature 1, not a mean over seeds.

Every run also prints its first step's `policy/behaviour_drift` (mean |log π_old - log π_behaviour|
before any update: zero up to float noise when the engine and the trainer agree on the behaviour
logprob), and `RESULT temperature=<t> step1_behaviour_drift=<largest over the runs>`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import shutil
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from reinforge.algorithms import (
    GRPO,
    collate_transitions,
    compute_advantages,
    compute_token_logprobs,
    loss_scales,
    policy_loss,
)
from reinforge.algorithms.config import LossAggregation
from reinforge.credit import CreditConfig
from reinforge.credit.config import CreditSource
from reinforge.demo.agent import calc_agent
from reinforge.demo.run import DemoSettings
from reinforge.demo.tasks import train_tasks, val_tasks
from reinforge.demo.warm_start import SHIPPED_WARM_START, WarmStartConfig, build_warm_start, load_warm_start
from reinforge.store.factory import open_store
from reinforge.training import (
    CheckpointSettings,
    EngineSettings,
    OptimSettings,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    Trainer,
    TrainerConfig,
)
from reinforge.training.rollouts import collect_transitions
from reinforge.types import MAX_PAGE_SIZE, RolloutMode, RolloutQuery

ROOT = Path(__file__).resolve().parents[1]
TEMPERED_STEPS = 30
"""Policy updates per run at a temperature other than 1 when `--steps` is not given."""
BUILT_WARM_START = ROOT / ".bench" / "calc-warm-start"


@dataclass(frozen=True)
class Variant:
    """One way of training: how spans become transitions, and how the loss is normalised."""

    name: str
    mode: Literal["per_call", "merged"]
    assignment: tuple[CreditSource, ...]
    loss_agg: LossAggregation = "token-mean"
    seq_unit: Literal["rollout", "transition"] = "rollout"


VARIANTS = (
    Variant("per_call/equal+air", "per_call", ("equal", "air")),
    Variant("merged/equal+air", "merged", ("equal", "air")),
    Variant("per_call/equal", "per_call", ("equal",)),
    Variant("merged/equal", "merged", ("equal",)),
)
ABLATION = Variant(
    "per_call/equal+air/seq-mean-per-transition",
    "per_call",
    ("equal", "air"),
    loss_agg="seq-mean-token-mean",
    seq_unit="transition",
)


def resolve_warm_start(explicit: Path | None) -> Path:
    """The given folder, else the warm start reinforge ships, else one built (once) under .bench/."""
    for path in (explicit, SHIPPED_WARM_START, BUILT_WARM_START):
        if path is not None and (path / "config.json").is_file():
            return path
    print(f"no shipped warm start; building the demo's recipe into {BUILT_WARM_START} (minutes, once)")
    build_warm_start(BUILT_WARM_START, WarmStartConfig(seed=DemoSettings().seed))
    return BUILT_WARM_START


def run_variant(variant: Variant, warm: Path, args: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    """Train one variant from the warm start; returns its summary (and keeps its run folder)."""
    model, tokenizer = load_warm_start(warm)
    run_dir = out_dir / variant.name.replace("/", "__")
    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(
            group_size=args.group_size,
            loss_agg=variant.loss_agg if variant.seq_unit == "transition" else args.loss_agg,
            seq_unit=variant.seq_unit,
        ),
        credit=CreditConfig(mode=variant.mode, assignment=variant.assignment),
        config=TrainerConfig(
            run_dir=run_dir,
            seed=args.seed,
            progress=False,
            optim=OptimSettings(learning_rate=args.learning_rate, lr_schedule=args.lr_schedule),
            # The demo's serving settings (reinforge.demo.run), so the runs match `reinforge demo`.
            rollouts=RolloutSettings(
                tasks_per_step=args.tasks_per_step, max_tokens=48, temperature=args.temperature
            ),
            runners=RunnerSettings(concurrency=128),
            engine=EngineSettings(max_batch_size=128),
            schedule=ScheduleSettings(max_steps=args.steps, val_every=0, val_greedy=not args.no_greedy),
            checkpoints=CheckpointSettings(every=0, resume=False),
        ),
    )
    started = time.monotonic()
    fit = trainer.fit(calc_agent, train_tasks(seed=args.seed), val_tasks(args.val_size))
    steps = [r for r in fit.history if "train/success" in r and "final" not in r]
    return {
        "variant": variant.name,
        "before": fit.val_before,
        "after": fit.val_after,
        "steps": fit.steps,
        "rl_minutes": fit.rl_seconds / 60,
        "wall_minutes": (time.monotonic() - started) / 60,
        "train_success": [float(r["train/success"]) for r in steps],
        "history": steps,
        "run_dir": str(run_dir),
    }


def _mean(records: list[dict[str, Any]], key: str) -> float:
    values = [float(r[key]) for r in records if isinstance(r.get(key), int | float)]
    return sum(values) / len(values) if values else float("nan")


def _first_key(records: list[dict[str, Any]], *keys: str) -> str:
    """The first of `keys` the step records carry (metric names differ between layers' versions)."""
    for key in keys:
        if any(key in r for r in records):
            return key
    return keys[0]


def describe(summary: dict[str, Any]) -> str:
    """One run as a few lines: held-out before/after, the curve, and the collapse indicators."""
    h = summary["history"]
    before, after = summary["before"], summary["after"]
    nan = float("nan")
    curve = summary["train_success"]
    third = max(1, len(h) // 3)
    entropy = _first_key(h, "policy/entropy")
    clip = _first_key(h, "clip/frac")
    for r in h:
        if r.get("groups"):
            r["flat_share"] = float(r.get("groups_flat", 0.0)) / float(r["groups"])
    greedy = (
        f", greedy {before['val/greedy_success']:.3f} -> {after.get('val/greedy_success', nan):.3f}"
        if "val/greedy_success" in before
        else ""
    )
    lines = [
        f"{summary['variant']}: held-out sampled {before.get('val/success', nan):.3f} -> "
        f"{after.get('val/success', nan):.3f}{greedy}  ({summary['steps']} steps, "
        f"{summary['rl_minutes']:.1f} min RL, {summary['wall_minutes']:.1f} min wall)",
        "    train success by step: " + " ".join(f"{s:.2f}" for s in curve),
        f"    first/last third: entropy {_mean(h[:third], entropy):.3f}/{_mean(h[-third:], entropy):.3f}, "
        f"clip frac {_mean(h[:third], clip):.3f}/{_mean(h[-third:], clip):.3f}, "
        f"flat groups {_mean(h[:third], 'flat_share'):.2f}/{_mean(h[-third:], 'flat_share'):.2f}, "
        f"grad norm {_mean(h[:third], 'update/grad_norm'):.3f}/{_mean(h[-third:], 'update/grad_norm'):.3f}, "
        f"transitions/step {_mean(h, 'transitions'):.0f}, "
        f"trained tokens/step {_mean(h, 'credit/trained_tokens'):.0f}",
    ]
    if h:
        lines.append(
            f"    step 1: behaviour drift {float(h[0].get('policy/behaviour_drift', nan)):.2e} "
            f"(max {float(h[0].get('policy/behaviour_drift_max', nan)):.2e}), "
            f"TIS weight {float(h[0].get('tis/weight_mean', nan)):.4f}"
        )
    drop = before.get("val/success", 0.0) - after.get("val/success", 0.0)
    if drop > 0.05:
        lines.append(f"    COLLAPSE: held-out sampled success fell by {drop:.3f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    demo = DemoSettings()
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="2 steps of 8 tasks x 4 per run, 32 held-out tasks"
    )
    parser.add_argument("--steps", type=int, default=None, help="policy updates per run (the RL budget)")
    parser.add_argument("--tasks-per-step", type=int, default=None)
    parser.add_argument("--group-size", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=demo.learning_rate)
    parser.add_argument(
        "--lr-schedule",
        choices=["constant", "linear", "cosine"],
        default=None,
        help="learning-rate schedule (default: constant at temperature 1, else the demo's linear decay)",
    )
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of training and sampled validation (the policy is trained at it)",
    )
    parser.add_argument("--val-size", type=int, default=None)
    parser.add_argument(
        "--loss-agg",
        choices=["token-mean", "seq-mean-token-mean", "seq-mean-token-sum"],
        default="seq-mean-token-mean",
        help="loss aggregation of the four main variants (sequences are rollouts; the demo's default)",
    )
    parser.add_argument("--no-greedy", action="store_true", help="skip greedy validation")
    parser.add_argument(
        "--ablation", action="store_true", help="also run per-call with per-transition seq-mean"
    )
    parser.add_argument("--only", default=None, help="comma-separated variant names to run")
    parser.add_argument("--warm-start", type=Path, default=None, help="model folder (default: the demo's)")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "learning-bench")
    parser.add_argument("--seed", type=int, default=demo.seed)
    parser.add_argument(
        "--gradient-check",
        action="store_true",
        help="compare first-step gradients across loss normalisations",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs trained at once, one process each")
    return parser


GRADIENT_CASES: tuple[
    tuple[str, Literal["per_call", "merged"], LossAggregation, Literal["rollout", "transition"]], ...
] = (
    ("merged, token-mean", "merged", "token-mean", "rollout"),
    ("per_call, token-mean", "per_call", "token-mean", "rollout"),
    ("per_call, seq-mean-token-mean per rollout", "per_call", "seq-mean-token-mean", "rollout"),
    ("merged, seq-mean-token-mean", "merged", "seq-mean-token-mean", "rollout"),
    ("per_call, seq-mean-token-mean per transition", "per_call", "seq-mean-token-mean", "transition"),
)


def gradient_check(run_dir: Path, warm: Path, group_size: int) -> list[str]:
    """Compare the first step's policy gradient under each transition mode and loss normalisation.

    The spans of a finished run's first step are turned into transitions per call and merged, and the
    gradient of the warm-start policy is computed for each normalisation. Cosine and norm are against
    merged/token-mean; "answer weight" is the share of the loss weight on the short final-answer
    calls (no tool call), which per-transition normalisation inflates.
    """
    return asyncio.run(_gradient_check(run_dir, warm, group_size))


async def _gradient_check(run_dir: Path, warm: Path, group_size: int) -> list[str]:
    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        page = await store.query_rollouts(RolloutQuery(mode=RolloutMode.train, limit=MAX_PAGE_SIZE))
        first = [r for r in page.items if "-s1-" in r.rollout_id]
        built = {
            "per_call": (await collect_transitions(store, first, CreditConfig(mode="per_call")))[0],
            "merged": (await collect_transitions(store, first, CreditConfig(mode="merged")))[0],
        }
    finally:
        await store.close()
    model, tokenizer = load_warm_start(warm)
    call_start = tokenizer.convert_tokens_to_ids("<tool_call>")
    grads: dict[str, torch.Tensor] = {}
    lines = []
    for label, mode, loss_agg, seq_unit in GRADIENT_CASES:
        algorithm = GRPO(group_size=group_size, loss_agg=loss_agg, seq_unit=seq_unit)
        transitions = [t.model_copy(deep=True) for t in built[mode] if any(t.response_mask)]
        compute_advantages(transitions, algorithm)
        scales = loss_scales(transitions, algorithm)
        batch = collate_transitions(transitions, pad_token_id=int(tokenizer.pad_token_id))
        model.zero_grad(set_to_none=True)
        lp = compute_token_logprobs(model, batch.input_ids, batch.attention_mask, batch.response_mask)
        loss, _ = policy_loss(
            lp.logprobs,
            batch.behaviour_logprobs,
            batch.advantages,
            batch.response_mask,
            algorithm,
            old_logprobs=lp.logprobs.detach(),
            scales=torch.tensor(scales, dtype=torch.float32),
        )
        loss.backward()
        grads[label] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        weights = [scale * sum(t.response_mask) for scale, t in zip(scales, transitions, strict=True)]
        answers = sum(
            w
            for w, t in zip(weights, transitions, strict=True)
            if t.num_calls == 1 and call_start not in t.response_ids
        )
        reference = grads[GRADIENT_CASES[0][0]]
        cosine = float(torch.nn.functional.cosine_similarity(grads[label], reference, dim=0))
        lines.append(
            f"    {label:<46} {len(transitions):>4} transitions  cosine {cosine:+.3f}  "
            f"norm x{float(grads[label].norm() / reference.norm()):.2f}  "
            f"answer weight {answers / sum(weights):.2f}"
        )
    return lines


def apply_temperature_defaults(args: argparse.Namespace) -> None:
    """Fill `--steps` and `--lr-schedule` where not given: at temperature 1 the budget the
    temperature-1 figures were measured with (20 steps unless asked, constant rate); elsewhere 30
    steps and the demo's linear decay, because a step of the weights moves the policy 1/T as far."""
    tempered = args.temperature != 1.0
    if args.steps is None and tempered and not args.quick:
        args.steps = TEMPERED_STEPS
    if args.lr_schedule is None:
        args.lr_schedule = DemoSettings().lr_schedule if tempered else "constant"


def _one_thread() -> None:
    torch.set_num_threads(1)


def main() -> None:
    demo = DemoSettings()
    args = build_parser().parse_args()
    apply_temperature_defaults(args)
    args.steps = args.steps if args.steps is not None else (2 if args.quick else 20)
    args.tasks_per_step = args.tasks_per_step or (8 if args.quick else demo.tasks_per_step)
    args.group_size = args.group_size or (4 if args.quick else demo.group_size)
    args.val_size = args.val_size or (32 if args.quick else demo.val_size)
    args.no_greedy = args.no_greedy or args.quick
    torch.set_num_threads(1)  # one thread per process: the machine's 2 cores are shared

    variants = [*VARIANTS, *([ABLATION] if args.ablation else [])]
    if args.only:
        wanted = set(args.only.split(","))
        variants = [v for v in variants if v.name in wanted]
        if not variants:
            raise SystemExit(
                f"--only matched no variant; names: {', '.join(v.name for v in (*VARIANTS, ABLATION))}"
            )
    warm = resolve_warm_start(args.warm_start)
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"learning_bench: warm start {warm}; GRPO {args.tasks_per_step} tasks x {args.group_size} per "
        f"step, lr {args.learning_rate} ({args.lr_schedule}), temperature {args.temperature}, "
        f"loss {args.loss_agg}, {args.steps} steps per run, "
        f"{args.val_size} held-out tasks; "
        f"torch threads 1, load average {os.getloadavg()[0]:.1f} (2 cores, shared)",
        flush=True,
    )
    summaries: dict[str, dict[str, Any]] = {}
    # Runs are independent; --jobs N runs N at once in separate processes (each on one torch thread).
    with ProcessPoolExecutor(
        max_workers=max(1, args.jobs),
        mp_context=multiprocessing.get_context("spawn"),
        initializer=_one_thread,
    ) as pool:
        futures = {pool.submit(run_variant, v, warm, args, args.out): v for v in variants}
        for future in as_completed(futures):
            summary = future.result()
            summaries[summary["variant"]] = summary
            print(describe(summary) + f"\n    (load average {os.getloadavg()[0]:.1f})", flush=True)
    summaries = {v.name: summaries[v.name] for v in variants}
    (args.out / "summary.json").write_text(
        json.dumps({k: {**v, "history": v["history"]} for k, v in summaries.items()}, indent=1) + "\n",
        encoding="utf-8",
    )
    print(f"run folders and summary.json under {args.out}")
    if args.gradient_check:
        source = Path(next(iter(summaries.values()))["run_dir"])
        print(
            f"first-step policy gradient from the warm start, spans of {source.name} (vs merged, token-mean):"
        )
        print("\n".join(gradient_check(source, warm, args.group_size)))
    drifts = [
        float(v["history"][0].get("policy/behaviour_drift", "nan"))
        for v in summaries.values()
        if v["history"]
    ]
    if drifts:
        print(f"RESULT temperature={args.temperature} step1_behaviour_drift={max(drifts):.2e}")
    per_call = summaries.get("per_call/equal+air")
    merged = summaries.get("merged/equal+air")
    if per_call is None or merged is None:
        print("no RESULT line: it needs both per_call/equal+air and merged/equal+air")
        sys.exit(0)
    print(
        f"RESULT percall_after={per_call['after'].get('val/success', float('nan')):.3f} "
        f"merged_after={merged['after'].get('val/success', float('nan')):.3f}"
    )


if __name__ == "__main__":
    main()
