"""Releasing a thread's OpenMP workers: the engine frees its starting thread's pool, so its own
thread's pool is the only one (engine.openmp)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from reinforge.engine.openmp import _libgomp

pytestmark = pytest.mark.skipif(_libgomp() is None, reason="this torch does not run on libgomp")

CHILD = textwrap.dedent(
    """
    import os, time, torch
    from reinforge.engine.openmp import release_openmp_workers
    torch.set_num_threads(2)
    tasks = lambda: len(os.listdir("/proc/self/task"))
    before = tasks()
    a = torch.randn(512, 512)
    a @ a  # a parallel region: this thread's pool gets its worker
    grown = tasks()
    released = release_openmp_workers()
    # The worker leaves on its own schedule (on a loaded machine, some milliseconds later).
    deadline = time.monotonic() + 10
    while tasks() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    after = tasks()
    a @ a  # and it comes back when the thread computes again
    print(before, grown, released, after, tasks())
    """
)


def test_the_calling_threads_workers_are_freed_and_come_back() -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True, timeout=120
    )
    before, grown, released, after, again = out.stdout.split()
    assert released == "True"
    assert int(grown) == int(before) + 1  # two threads: the caller and one worker
    assert int(after) == int(before)
    assert int(again) == int(grown)


ENGINE_CHILD = textwrap.dedent(
    """
    import os, time, torch
    from reinforge.engine import Engine
    from reinforge.models import build_tokenizer, tiny_llama
    torch.set_num_threads(2)
    tok = build_tokenizer([f"{a} plus {b} is {a + b}" for a in range(30) for b in range(30)], vocab_size=300)
    model = tiny_llama(tok, hidden_size=64, num_layers=2, intermediate_size=128)
    a = torch.randn(512, 512)
    a @ a
    tasks = lambda: len(os.listdir("/proc/self/task"))
    before = tasks()
    engine = Engine(model, tok, max_batch_size=2, max_seq_len=64).start()
    deadline = time.monotonic() + 10  # the freed worker leaves on its own schedule
    while tasks() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    print(before, tasks())
    engine.stop()
    """
)


def test_starting_the_engine_frees_the_starting_threads_pool() -> None:
    """The engine's thread appears, the starting thread's OpenMP worker goes."""
    out = subprocess.run(
        [sys.executable, "-c", ENGINE_CHILD], capture_output=True, text=True, check=True, timeout=300
    )
    before, started = map(int, out.stdout.split()[-2:])
    assert started == before  # +1 engine thread, -1 worker of the starting thread
