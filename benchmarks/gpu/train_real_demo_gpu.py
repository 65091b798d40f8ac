"""Train the real-model demo on a GPU: `reinforge demo --model smollm2-135m-instruct`'s run (the
OpenAI-SDK calculator agent, GRPO, the same tasks, held-out set and budget) with the update and the
embedded engine on CUDA in bfloat16. Prints the demo's RESULT line and the RL steps per second.

    python benchmarks/gpu/train_real_demo_gpu.py                  # a CUDA machine with the [models] extra
    python benchmarks/gpu/train_real_demo_gpu.py --minutes 5 --val-size 200

The model comes from the models cache (`reinforge models prepare smollm2-135m-instruct` converts the
packaged GGUF once). Asking for CUDA where torch sees none is an error (exit code 2), never a silent
CPU run: the CPU run is `reinforge demo --model smollm2-135m-instruct`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from reinforge.demo.real.run import RealDemoSettings, run_real_demo
from reinforge.training.config import ComputeSettings


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--model", default="smollm2-135m-instruct", help="a packaged model, GGUF, folder or hub id"
    )
    parser.add_argument("--device", default="cuda", help="cuda or cuda:N (default cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--minutes", type=float, default=5.0, help="RL wall-time budget")
    parser.add_argument("--max-steps", type=int, default=60)
    parser.add_argument("--val-size", type=int, default=200)
    parser.add_argument("--run-dir", type=Path, default=None, help="default: a new temporary folder")
    return parser.parse_args(argv)


def settings_for(args: argparse.Namespace) -> RealDemoSettings:
    return RealDemoSettings(
        model=args.model,
        run_dir=args.run_dir or Path(tempfile.mkdtemp(prefix="reinforge-gpu-real-demo-")),
        minutes=args.minutes,
        max_steps=args.max_steps,
        val_size=args.val_size,
        progress=False,
        compute=ComputeSettings(device=args.device, dtype=args.dtype),
    )


def cuda_missing(device: str) -> str | None:
    """Why `device` can't be used here, or None when it can."""
    if not device.startswith("cuda"):
        return f"--device {device}: this script trains on a CUDA GPU; the CPU run is `reinforge demo --model`"
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return f"--device {device}, but torch {torch.__version__} ({build}) sees no CUDA GPU"
    return None


def main(argv: list[str]) -> int:
    args = parse(argv)
    problem = cuda_missing(args.device)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    settings = settings_for(args)
    print(
        f"training the real-model demo on {args.device} ({torch.cuda.get_device_name(args.device)}), "
        f"dtype {args.dtype}, in {settings.run_dir}"
    )
    started = time.monotonic()
    result = run_real_demo(settings)
    rate = 1.0 / result.split.step if result.split.step > 0 else float("nan")
    print(result.result_line())
    print(f"RESULT gpu_real_demo_steps_per_s={rate:.3f} steps={result.steps} device={args.device}")
    print(f"wall time {time.monotonic() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
