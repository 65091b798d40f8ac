"""benchmarks/_step_cpu.py: CPU per step, read over the steps a run logs (real processes, real files)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _load(name: str) -> ModuleType:
    if str(BENCHMARKS) not in sys.path:
        sys.path.insert(0, str(BENCHMARKS))
    return importlib.import_module(name)


def test_cpu_per_step_from_a_clock_read_at_each_step_end() -> None:
    step_cpu = _load("_step_cpu")
    cpu = step_cpu.from_step_ends([1.0, 1.5, 2.0, 3.0], [10.0, 10.4, 10.9, 11.5])
    assert cpu.steps == 3  # the first step is left out, as steps/s leaves it out
    assert cpu.own_per_step == pytest.approx(0.5)
    assert cpu.children_per_step == 0.0
    assert cpu.cores_busy == pytest.approx(1.5 / 2.0)
    assert step_cpu.from_step_ends([1.0], [10.0]) is None
    assert step_cpu.from_step_ends([1.0, 2.0], [10.0]) is None


def _log_step(path: Path, step: int, *, newline: bool = True) -> None:
    with path.open("a", encoding="utf-8") as f:
        f.write(json.dumps({"step": step, "train/reward": 0.5}) + ("\n" if newline else ""))


def _wait_for(predicate: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_sampler_reads_child_cpu_between_the_first_and_last_logged_step(tmp_path: Path) -> None:
    step_cpu = _load("_step_cpu")
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text(json.dumps({"step": 0, "val/success": 0.1}) + "\n", encoding="utf-8")
    burn = (
        "import sys, time\n"
        "t = time.process_time()\n"
        "while time.process_time() - t < 0.6: pass\n"  # a margin over the 0.55 awaited below
        "sys.stdin.read()"
    )
    # relist_s=0: the child starts after the first sample, and the test doesn't wait out the relisting
    with step_cpu.MetricsCpuSampler(metrics, every_s=0.02, relist_s=0.0) as sampler:
        _log_step(metrics, 1)
        _wait_for(lambda: len(sampler._samples) == 1)
        child = subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE)
        try:
            time.sleep(0.1)
            _log_step(metrics, 2, newline=False)  # half a line is not a step yet
            time.sleep(0.1)
            assert len(sampler._samples) == 1
            with metrics.open("a", encoding="utf-8") as f:
                f.write("\n")
            _wait_for(lambda: sampler._samples[-1][0] == 2)
            _wait_for(lambda: child.poll() is None and _child_cpu(child.pid) >= 0.55)
            _log_step(metrics, 3)
            _wait_for(lambda: sampler._samples[-1][0] == 3)
        finally:
            assert child.stdin is not None
            child.stdin.close()
            child.wait(10)
    cpu = sampler.result()
    assert cpu is not None
    assert cpu.steps == 2
    # The child burned 0.6 s of CPU (plus its start) between step 1 and step 3: 0.25+ a step.
    assert 0.25 <= cpu.children_per_step < 1.5
    assert cpu.own_per_step >= 0.0
    assert cpu.per_step == pytest.approx(cpu.own_per_step + cpu.children_per_step)


def _child_cpu(pid: int) -> float:
    import psutil

    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


def test_trainer_bench_agents_send_one_call_and_score_its_first_tool_call() -> None:
    bench = _load("trainer_bench")
    task = {"question": "2+3*4", "expected": "3*4"}

    class _LLM:
        model = "policy"
        resources = {"sampling": {"temperature": 0.7, "max_tokens": 12}}

    body = bench.first_call_request(task, _LLM())
    assert body["messages"] == [{"role": "user", "content": "2+3*4"}]
    assert [t["function"]["name"] for t in body["tools"]] == ["calculator"]
    assert (body["temperature"], body["max_tokens"], body["model"]) == (0.7, 12, "policy")
    assert bench.first_call_reward("calculator", '{"expression": "3 * 4"}', task) == 1.0
    assert bench.first_call_reward("calculator", '{"expression": "2+3"}', task) == 0.0
    assert bench.first_call_reward("search", '{"expression": "3*4"}', task) == 0.0
    assert bench.first_call_reward("calculator", None, task) == 0.0
