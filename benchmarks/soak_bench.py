"""Soak: a long run of small calc training steps, sampling memory, file descriptors, store size and
step time, to show that none of them grows with the number of steps.

The calc demo's tiny model and agent, trained by `Trainer.fit` exactly as `reinforge demo` does it
(SQLite store in the run folder behind its server, gateway, engine, runner child processes), but
with small steps (`--tasks` tasks x `--group` rollouts) so that thousands of them fit in an hour.
A sampler thread records, every `--sample-s` seconds: the steps done (metrics.jsonl), the RSS of the
trainer and of every child process, their open file descriptors, and the store's size on disk
(store.db plus its WAL). The figures are fitted over the second half of the run (after the warm-up
fills caches, pools and the allocator's arenas):

- RSS growth per 1,000 steps (the slope of all processes' RSS against steps; goal: flat within
  noise, i.e. a few MB against a ~1 GB total);
- store MB per 1,000 steps (the slope of the store's size), also per 1,000 rollouts, since a step's
  size is the user's choice (`reinforge demo` runs 128 rollouts a step);
- step time, first tenth against last tenth (goal: flat);
- open fds, min and max over the second half (goal: no growth).

    nice -n 10 .venv/bin/python benchmarks/soak_bench.py [--steps 2000] [--minutes 60] [--quick]

Writes the samples to `<run-dir>/soak_samples.jsonl` and ends with
`RESULT soak_steps=... soak_rss_growth_mb_per_1k_steps=... soak_store_mb_per_1k_steps=...`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil


def _steps_done(metrics: Path) -> tuple[int, list[float]]:
    """The last step logged and the step times so far (`time/step_s`)."""
    if not metrics.is_file():
        return 0, []
    step, times = 0, []
    for line in metrics.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line being written
        if "time/step_s" in row:
            step = max(step, int(row["step"]))
            times.append(float(row["time/step_s"]))
    return step, times


def _store_bytes(run_dir: Path) -> tuple[int, int]:
    """(the database's own size, its files on disk). The first is what the data takes: pages in use,
    as a reader sees them through the WAL. The files also hold the WAL, which is reused and restarted
    at a fixed size (`store.sql.database`), so it is bounded, not growth."""
    disk = sum(p.stat().st_size for p in run_dir.glob("store.db*") if p.is_file())
    path = run_dir / "store.db"
    if not path.is_file():
        return 0, disk
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as db:
            pages = db.execute("PRAGMA page_count").fetchone()[0]
            free = db.execute("PRAGMA freelist_count").fetchone()[0]
            size = db.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.Error:
        return 0, disk
    return (pages - free) * size, disk


def _processes() -> list[psutil.Process]:
    me = psutil.Process()
    return [me, *me.children(recursive=True)]


def _sample(run_dir: Path, started: float) -> dict[str, Any]:
    rss = fds = 0
    count = 0
    by_process: dict[str, float] = {}
    for proc in _processes():
        try:
            one = proc.memory_info().rss
            fds += proc.num_fds()
            name = "trainer" if proc.pid == os.getpid() else f"{proc.pid} {' '.join(proc.cmdline()[2:4])}"
        except psutil.Error:
            continue  # exited between the listing and the read
        rss += one
        count += 1
        by_process[name] = round(one / 2**20, 1)
    step, _ = _steps_done(run_dir / "metrics.jsonl")
    data, disk = _store_bytes(run_dir)
    return {
        "t": round(time.monotonic() - started, 2),
        "step": step,
        "rss_mb": round(rss / 2**20, 1),
        "fds": fds,
        "processes": count,
        "store_mb": round(data / 2**20, 3),
        "store_disk_mb": round(disk / 2**20, 3),
        "rss_mb_by_process": by_process,
    }


class Sampler(threading.Thread):
    def __init__(self, run_dir: Path, every_s: float) -> None:
        super().__init__(name="soak-sampler", daemon=True)
        self.run_dir, self.every_s = run_dir, every_s
        self.samples: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self._out = (run_dir / "soak_samples.jsonl").open("a")

    def run(self) -> None:
        started = time.monotonic()
        while not self.stop.wait(self.every_s):
            sample = _sample(self.run_dir, started)
            self.samples.append(sample)
            self._out.write(json.dumps(sample) + "\n")
            self._out.flush()


def _slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs (nan when xs do not vary)."""
    if len(xs) < 2 or max(xs) == min(xs):
        return float("nan")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def _train(run_dir: Path, args: argparse.Namespace) -> tuple[int, int]:
    import torch
    import transformers

    from reinforge.algorithms import GRPO
    from reinforge.credit import CreditConfig
    from reinforge.demo.agent import calc_agent
    from reinforge.demo.tasks import train_tasks, val_tasks
    from reinforge.demo.warm_start import SHIPPED_WARM_START, load_warm_start
    from reinforge.training.config import (
        CheckpointSettings,
        EngineSettings,
        OptimSettings,
        RolloutSettings,
        RunnerSettings,
        ScheduleSettings,
        TrainerConfig,
    )
    from reinforge.training.trainer import Trainer

    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()
    model, tokenizer = load_warm_start(SHIPPED_WARM_START)
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=args.group, loss_agg="seq-mean-token-mean", seq_unit="rollout"),
        credit=CreditConfig(mode="merged", assignment=("equal", "air")),
        config=TrainerConfig(
            run_dir=run_dir,
            progress=False,
            optim=OptimSettings(learning_rate=1e-4, lr_schedule="constant"),
            rollouts=RolloutSettings(tasks_per_step=args.tasks, max_tokens=48),
            runners=RunnerSettings(concurrency=32, processes=args.runner_processes),
            engine=EngineSettings(max_batch_size=32),
            schedule=ScheduleSettings(max_steps=args.steps, max_minutes=args.minutes, val_every=0),
            checkpoints=CheckpointSettings(every=args.checkpoint_every),
        ),
    )
    fit = trainer.fit(calc_agent, train_tasks(seed=0), val_tasks(2))
    return fit.steps, args.tasks * args.group


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--minutes", type=float, default=60.0, help="stop after this much training")
    parser.add_argument("--tasks", type=int, default=2, help="tasks per step")
    parser.add_argument("--group", type=int, default=4, help="rollouts per task")
    parser.add_argument("--runner-processes", type=int, default=2)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--sample-s", type=float, default=5.0)
    parser.add_argument("--run-dir", type=Path, default=None, help="keep the run here (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="40 steps (a smoke run)")
    args = parser.parse_args()
    if args.quick:
        args.steps, args.sample_s = 40, 1.0
    temp = None if args.run_dir else tempfile.mkdtemp(prefix="reinforge-soak-")
    run_dir = args.run_dir or Path(temp or ".")
    run_dir.mkdir(parents=True, exist_ok=True)
    sampler = Sampler(run_dir, args.sample_s)
    sampler.start()
    try:
        steps, rollouts_per_step = _train(run_dir, args)
    finally:
        sampler.stop.set()
        sampler.join()
    # While training: from the first step until the last one is logged (then the run shuts down).
    samples = [s for s in sampler.samples if 0 < s["step"] < steps] or sampler.samples
    _, step_times = _steps_done(run_dir / "metrics.jsonl")
    half = [s for s in samples if s["step"] >= steps / 2] or samples
    xs = [float(s["step"]) for s in half]
    rss_per_1k = _slope(xs, [s["rss_mb"] for s in half]) * 1000
    store_per_1k = _slope(xs, [s["store_mb"] for s in half]) * 1000
    tenth = max(1, len(step_times) // 10)
    first, last = statistics.median(step_times[:tenth]), statistics.median(step_times[-tenth:])
    fds = [s["fds"] for s in half]
    rss = [s["rss_mb"] for s in half]
    print(
        f"{steps} steps of {rollouts_per_step} rollouts; RSS (all processes) {min(rss):.0f}-{max(rss):.0f} "
        f"MB over the second half; fds {min(fds)}-{max(fds)}; step time median first tenth {first:.2f} s, "
        f"last tenth {last:.2f} s; store data {samples[-1]['store_mb']:.1f} MB at the end "
        f"({samples[-1]['store_disk_mb']:.1f} MB of files with the WAL); samples in "
        f"{run_dir / 'soak_samples.jsonl'}"
    )
    print(
        f"RESULT soak_steps={steps} soak_rss_growth_mb_per_1k_steps={rss_per_1k:.1f} "
        f"soak_store_mb_per_1k_steps={store_per_1k:.2f} "
        f"soak_store_mb_per_1k_rollouts={store_per_1k / rollouts_per_step:.2f} "
        f"soak_step_s_first={first:.3f} soak_step_s_last={last:.3f} soak_fds_max={max(fds)}"
    )
    if temp is not None:
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    main()
