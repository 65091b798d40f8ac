"""benchmarks/load_bench.py and soak_bench.py: a small load run finishes with no errors and every
call recorded; the soak's figures come from the fits it claims (the soak itself takes an hour)."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_small_load_run_has_no_errors_and_records_every_call() -> None:
    small = ["--agents", "20", "--seconds", "3", "--drivers", "1", "--think-ms", "100"]
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "load_bench.py"), *small],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = re.search(r"^20 agents .*: (\d+) calls .*store: (\d+) LLM spans", done.stdout, re.M)
    assert summary is not None, done.stdout
    assert int(summary.group(1)) > 20 and summary.group(1) == summary.group(2)
    result = re.search(
        r"^RESULT load_errors=(\d+) load_p50_ms=([\d.]+) load_p99_ms=([\d.]+) ", done.stdout, re.M
    )
    assert result is not None, done.stdout
    assert int(result.group(1)) == 0
    assert 0 < float(result.group(2)) <= float(result.group(3))


def test_soak_fits_and_step_log(tmp_path: Path) -> None:
    soak = _module("soak_bench")
    assert soak._slope([0, 1000, 2000], [700.0, 705.0, 710.0]) == 0.005
    assert soak._slope([5, 5], [1.0, 2.0]) != soak._slope([5, 5], [1.0, 2.0])  # nan: no spread
    metrics = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val/success": 0.5}, {"step": 1, "time/step_s": 0.5}, {"step": 2, "time/step_s": 0.7}]
    metrics.write_text(
        "\n".join(json.dumps(r) for r in rows) + '\n{"step": 3, "time/st'
    )  # a line being written
    assert soak._steps_done(metrics) == (2, [0.5, 0.7])
    assert soak._steps_done(tmp_path / "absent.jsonl") == (0, [])
