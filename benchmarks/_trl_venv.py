"""The TRL baseline's venv: `.bench/trl-venv`, created and filled on first use.

torch goes in first (the local CPU wheel at the version reinforge uses); installed afterwards, TRL's
own dependency on torch would pull a multi-GB CUDA build. TRL is pinned so that every run of the
benchmark measures the same baseline.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TRL_VERSION = "1.16.0"
TORCH_VERSION = "2.13.0"
TRL_VENV = Path(__file__).resolve().parent.parent / ".bench" / "trl-venv"


def trl_python() -> Path | str:
    """The venv's interpreter, installing it if needed; the reason as a string when that fails."""
    python = TRL_VENV / "bin" / "python"
    probe = f"import trl, sys; sys.exit(trl.__version__ != {TRL_VERSION!r})"
    if python.is_file() and subprocess.run([str(python), "-c", probe], capture_output=True).returncode == 0:
        return python
    print(f"installing trl=={TRL_VERSION} into {TRL_VENV} (first run only)...", flush=True)
    TRL_VENV.parent.mkdir(parents=True, exist_ok=True)
    pip = [str(python), "-m", "pip", "install", "-q"]
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(TRL_VENV)],
        [*pip, f"torch=={TORCH_VERSION}"],
        [*pip, f"trl=={TRL_VERSION}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            return f"`{' '.join(step)}` failed: " + " | ".join(tail)
    if subprocess.run([str(python), "-c", probe], capture_output=True).returncode != 0:
        return f"trl {TRL_VERSION} is not importable after install"
    return python
