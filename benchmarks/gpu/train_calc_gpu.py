"""Train the calc demo on a GPU: `reinforge demo`'s run (the shipped warm start, GRPO 16 tasks x 8,
the same learning-rate schedule and held-out set) with the policy update and the embedded engine on
CUDA, bfloat16 by default. Prints the demo's RESULT line and the RL steps per second; the whole run
(warm start, held-out evaluation before and after, 5 minutes of RL) takes well under 10 minutes.

    python benchmarks/gpu/train_calc_gpu.py                    # a CUDA machine, nothing but the checkout
    python benchmarks/gpu/train_calc_gpu.py --dtype float32    # exact-math variant
    python benchmarks/gpu/train_calc_gpu.py --smoke            # CPU, two tiny steps: what CI runs

Asking for CUDA where torch sees none is an error (exit code 2), never a silent CPU run.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from reinforge.demo.run import DemoSettings, run_demo
from reinforge.training.config import ComputeSettings


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    parser.add_argument("--minutes", type=float, default=5.0, help="RL wall-time budget")
    parser.add_argument("--max-steps", type=int, default=400)
    parser.add_argument("--val-size", type=int, default=200)
    parser.add_argument("--runner-processes", type=int, default=2)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a new temporary folder")
    parser.add_argument(
        "--smoke", action="store_true", help="CPU, float32, two steps of 2 tasks x 2, 4 held-out tasks"
    )
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> DemoSettings:
    run_dir = args.run_dir or Path(tempfile.mkdtemp(prefix="reinforge-gpu-calc-"))
    if args.smoke:
        return DemoSettings(
            run_dir=run_dir,
            minutes=1.0,
            max_steps=2,
            tasks_per_step=2,
            group_size=2,
            val_size=4,
            runner_processes=0,
            checkpoint_every=0,
            progress=False,
            compute=ComputeSettings(device="cpu", dtype="float32"),
        )
    return DemoSettings(
        run_dir=run_dir,
        minutes=args.minutes,
        max_steps=args.max_steps,
        val_size=args.val_size,
        runner_processes=args.runner_processes,
        progress=False,
        compute=ComputeSettings(device=args.device, dtype=args.dtype),
    )


def main(argv: list[str]) -> int:
    args = parse(argv)
    device = "cpu" if args.smoke else args.device
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"error: --device {device}, but torch {torch.__version__} sees no CUDA GPU "
            f"({'CUDA ' + torch.version.cuda if torch.version.cuda else 'a CPU-only build'}); "
            "run on a GPU machine with a CUDA build of torch, or pass --smoke for the CPU smoke run",
            file=sys.stderr,
        )
        return 2
    settings = settings_for(args)
    where = torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda") else "CPU"
    print(
        f"training the calc demo on {device} ({where}), dtype {settings.compute.dtype}, in {settings.run_dir}"
    )
    started = time.monotonic()
    result = run_demo(settings)
    steps = [r["time/step_s"] for r in result.fit.history if "time/step_s" in r]
    # The first step pays one-time costs (CUDA kernels' first launch, allocator growth): left out.
    timed = steps[1:] or steps
    rate = len(timed) / sum(timed) if timed and sum(timed) > 0 else float("nan")
    print(result.result_line())
    print(f"RESULT gpu_calc_steps_per_s={rate:.3f} steps={result.fit.steps} device={device}")
    print(f"wall time {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
