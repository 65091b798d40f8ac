"""benchmarks/gpu/train_real_demo_gpu.py: the real-model demo's GPU recipe is the CPU demo's settings
on CUDA, and asking for CUDA where there is none fails loudly instead of training on the CPU."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from reinforge.demo.real.run import RealDemoSettings, trainer_config

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "train_real_demo_gpu.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_real_demo_gpu", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_recipe_is_the_cpu_demo_on_cuda_in_bfloat16(tmp_path: Path) -> None:
    script = _script()
    settings = script.settings_for(script.parse(["--run-dir", str(tmp_path), "--minutes", "3"]))
    cpu = RealDemoSettings(run_dir=tmp_path, minutes=3)
    assert settings.compute.device == "cuda" and settings.compute.dtype == "bfloat16"
    assert cpu.compute.device == "cpu"
    same = {"compute", "progress"}
    assert settings.model_dump(exclude=same) == cpu.model_dump(exclude=same)
    assert trainer_config(settings).compute.device == "cuda"


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is present: the script would train on it")
def test_the_gpu_recipe_refuses_to_fall_back_to_the_cpu(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = _script()
    assert script.main(["--run-dir", str(tmp_path / "run")]) == 2
    assert script.main(["--device", "cpu", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "sees no CUDA GPU" in err and "reinforge demo --model" in err
    assert not (tmp_path / "run").exists()
