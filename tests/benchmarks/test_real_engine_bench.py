"""The real-model engine benchmark and its GPU variant run end to end on a tiny model folder (CPU-cheap)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from reinforge.models import build_tokenizer, tiny_llama

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama and its tokenizer saved as a Hugging Face folder, standing in for SmolLM2."""
    corpus = [f"order {i} for {i % 7} lamps arrived broken, check the refund policy" for i in range(300)]
    tokenizer = build_tokenizer(corpus, vocab_size=300)
    model = tiny_llama(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128)
    folder = tmp_path_factory.mktemp("tiny-model")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def _run(script: str, folder: Path, *extra: str) -> list[str]:
    cmd = [
        sys.executable,
        str(ROOT / "benchmarks" / script),
        *("--model", str(folder), "--requests", "4", "--system-tokens", "48", "--new-tokens", "5"),
        *("--threads", "1", *extra),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.splitlines()


def _result(lines: list[str], name: str) -> float:
    found = [line for line in lines if line.startswith(f"RESULT {name}=")]
    assert len(found) == 1, lines
    return float(found[0].split("=")[1])


def test_cpu_real_engine_bench_smoke_run(tiny_folder: Path) -> None:
    lines = _run("real_engine_bench.py", tiny_folder)
    assert _result(lines, "real_engine_speedup_vs_hf_generate_c4") > 0
    assert 0 <= _result(lines, "real_engine_peak_fraction") < 1  # a tiny model is far from its bound
    peak = next(line for line in lines if line.startswith("fp32 matmul here:"))
    assert "before the engine's run" in peak and ", after " in peak  # the bound from the higher of two
    assert "greedy outputs identical to HF's: 4/4" in lines  # float32: token for token
    requests = next(line for line in lines if line.startswith("requests:"))
    assert "4 concurrent" in requests and "5 generated tokens each" in requests


def test_cpu_real_engine_gpu_bench_smoke_run(tiny_folder: Path) -> None:
    lines = _run("gpu/real_engine_gpu_bench.py", tiny_folder, "--device", "cpu", "--dtype", "float32")
    assert _result(lines, "real_engine_speedup_vs_hf_generate_c4") > 0
    assert any(line.startswith("model:") and "float32, cpu" in line for line in lines)
