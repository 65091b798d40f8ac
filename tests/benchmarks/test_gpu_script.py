"""benchmarks/gpu/train_calc_gpu.py: its CPU smoke run trains the calc demo end to end and prints the
demo's RESULT line and steps/s; asking for CUDA where there is none fails loudly."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "train_calc_gpu.py"


def test_gpu_script_smoke_run_on_cpu_prints_the_demo_result_and_steps_per_second(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke", "--run-dir", str(tmp_path / "run")],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    demo = re.search(r"^RESULT demo_heldout_success before=([\d.]+) after=([\d.]+) ", done.stdout, re.M)
    assert demo is not None, done.stdout
    assert 0.0 <= float(demo.group(1)) <= 1.0 and 0.0 <= float(demo.group(2)) <= 1.0
    rate = re.search(r"^RESULT gpu_calc_steps_per_s=([\d.]+) steps=2 device=cpu$", done.stdout, re.M)
    assert rate is not None and float(rate.group(1)) > 0, done.stdout
    assert (tmp_path / "run" / "metrics.jsonl").is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: the script would train on it")
def test_gpu_script_refuses_to_fall_back_to_the_cpu_when_cuda_is_absent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = importlib.util.spec_from_file_location("train_calc_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main(["--run-dir", str(tmp_path / "run")]) == 2
    assert script.main(["--device", "cuda:1", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "sees no CUDA GPU" in err and "--smoke" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: the scripts would run on it")
def test_run_all_runs_both_checks_and_records_each_exit_code_where_cuda_is_absent(tmp_path: Path) -> None:
    """Where a check fails (here: no CUDA), run_all.sh still runs the other one and says how each ended."""
    done = subprocess.run(
        ["bash", str(SCRIPT.parent / "run_all.sh"), str(tmp_path / "logs")],
        capture_output=True,
        text=True,
        timeout=240,
        env={"PATH": "/usr/bin:/bin", "PYTHON": sys.executable, "CALC_TIMEOUT_S": "120"},
    )
    env = (tmp_path / "logs" / "env.txt").read_text()
    assert "calc exit code: 2" in env and "engine exit code: 1" in env, env + done.stdout + done.stderr
    assert "sees no CUDA GPU" in (tmp_path / "logs" / "calc.log").read_text()
    assert "CUDA is not available" in (tmp_path / "logs" / "engine.log").read_text()
    assert f"torch {torch.__version__}" in env
