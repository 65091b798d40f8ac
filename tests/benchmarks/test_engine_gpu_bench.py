"""The GPU benchmark script runs end to end in its CPU smoke configuration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_cpu_gpu_bench_script_smoke_run() -> None:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / "gpu" / "engine_gpu_bench.py"),
        *("--device", "cpu", "--quick", "--dtype", "float32"),
        *("--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128"),
        *("--requests", "6", "--c1-requests", "2", "--min-new", "2", "--max-new", "6"),
        *("--concurrency", "1", "64"),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert any(line.split()[:2] == ["64", "6"] for line in lines), out.stdout
    result = [line for line in lines if line.startswith("RESULT engine_speedup_vs_hf_generate_c64=")]
    assert len(result) == 1 and float(result[0].split("=")[1]) > 0
    # Greedy outputs of the two sides agree in float32.
    row = next(line for line in lines if line.split()[:2] == ["64", "6"])
    assert "6/6" in row
