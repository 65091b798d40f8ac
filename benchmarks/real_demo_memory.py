"""Where the real-model demo's memory goes: a short run with an RSS timeline per phase.

    flock /tmp/heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/real_demo_memory.py \
        --steps 2 --val-size 8

Samples the trainer process's RSS and its children's every 0.2 s while marking the phase the trainer
is in (evaluation, the update, a publish and its LoRA merge), and records the engine's KV cache as it
grows. Prints, per phase, the highest RSS of the trainer process and of the whole process tree, and
the sizes of the weights each holder keeps. The run itself is `run_real_demo` with a small budget.
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil
import torch

GB = 1e9


class Timeline:
    def __init__(self) -> None:
        self.phases: list[str] = []
        self.rows: list[tuple[float, str, int, int]] = []
        self.events: list[tuple[float, str]] = []
        self.start = time.monotonic()
        self._stop = threading.Event()
        self._me = psutil.Process()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def mark(self, text: str) -> None:
        self.events.append((time.monotonic() - self.start, text))

    def phase(self) -> str:
        return "+".join(self.phases) or "other"

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            main = self._me.memory_info().rss
            children = 0
            for child in self._me.children(recursive=True):
                try:
                    children += child.memory_info().rss
                except psutil.Error:
                    continue
            self.rows.append((time.monotonic() - self.start, self.phase(), main, children))

    def __enter__(self) -> Timeline:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def wrap(owner: Any, name: str, timeline: Timeline, label: str) -> None:
    original = getattr(owner, name)
    if hasattr(original, "__wrapped__") and getattr(original, "_probe", False):
        return

    if _is_async(original):

        @functools.wraps(original)
        async def awrapper(*args: Any, **kwargs: Any) -> Any:
            timeline.phases.append(label)
            try:
                return await original(*args, **kwargs)
            finally:
                timeline.phases.remove(label)

        awrapper._probe = True  # type: ignore[attr-defined]
        setattr(owner, name, awrapper)
        return

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        timeline.phases.append(label)
        try:
            return original(*args, **kwargs)
        finally:
            timeline.phases.remove(label)

    wrapper._probe = True  # type: ignore[attr-defined]
    setattr(owner, name, wrapper)


def _is_async(fn: Callable[..., Any]) -> bool:
    import inspect

    return inspect.iscoroutinefunction(fn)


def tensor_bytes(tensors: Any) -> int:
    seen: set[int] = set()
    total = 0
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            continue
        storage = t.untyped_storage()
        key = storage.data_ptr()
        if key in seen or key == 0:
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--val-size", type=int, default=8)
    parser.add_argument("--micro-batch-tokens", type=int, default=None)
    args = parser.parse_args()

    from reinforge.demo.real.run import RealDemoSettings, run_real_demo
    from reinforge.engine import model_runner
    from reinforge.training import policy, rollout_stack, trainer

    timeline = Timeline()
    wrap(policy.Policy, "_update", timeline, "update")
    wrap(policy.Policy, "engine_state", timeline, "merge")
    wrap(rollout_stack.RolloutStack, "publish", timeline, "publish")
    wrap(trainer.Trainer, "_validate", timeline, "eval")
    wrap(trainer.Trainer, "_open_run", timeline, "open")

    grow = model_runner.SlotCacheRunner._ensure_capacity
    holders: dict[str, Any] = {}

    def ensure(self: Any, slots: int, length: int, *, exact: bool = False) -> None:
        before = (self._slot_cap, self._len_cap)
        grow(self, slots, length, exact=exact)
        if (self._slot_cap, self._len_cap) != before:
            kv = 2 * self._k.numel() * self._k.element_size()
            timeline.mark(f"KV -> {self._slot_cap} slots x {self._len_cap} positions = {kv / GB:.3f} GB")
        holders["runner"] = self

    model_runner.SlotCacheRunner._ensure_capacity = ensure  # type: ignore[method-assign]

    settings: dict[str, Any] = {
        "run_dir": Path(tempfile.mkdtemp(prefix="real-demo-memory-")),
        "max_steps": args.steps,
        "val_size": args.val_size,
        "progress": False,
    }
    if args.micro_batch_tokens:
        settings["micro_batch_tokens"] = args.micro_batch_tokens
    with timeline:
        result = run_real_demo(RealDemoSettings(**settings))
    print(result.result_line())
    print(f"reported peak tree RSS {result.peak_rss_gb:.2f} GB")

    runner = holders.get("runner")
    if runner is not None:
        engine_params = tensor_bytes(runner.model.parameters())
        fused = tensor_bytes(
            t for layer in runner.layers for t in (layer.qkv_w, layer.gate_up_w, layer.o_w, layer.down_w)
        )
        kv = 2 * runner._k.numel() * runner._k.element_size()
        print(
            f"engine model params {engine_params / GB:.3f} GB ({runner.dtype}); runner layer tensors "
            f"{fused / GB:.3f} GB (shared storage with the model where equal); KV {kv / GB:.3f} GB"
        )

    peaks: dict[str, tuple[int, int]] = {}
    for _, phase, main_rss, children in timeline.rows:
        old = peaks.get(phase, (0, 0))
        peaks[phase] = (max(old[0], main_rss), max(old[1], main_rss + children))
    print("phase: max trainer-process RSS / max tree RSS (GB)")
    for phase, (main_rss, tree) in sorted(peaks.items(), key=lambda kv: -kv[1][1]):
        print(f"  {phase:24s} {main_rss / GB:6.2f} {tree / GB:6.2f}")
    print("events:")
    for t, text in timeline.events:
        print(f"  {t:7.1f}s {text}")
    # A coarse timeline: one line every ~5 s.
    print("timeline (s, phase, trainer GB, children GB):")
    last = -10.0
    for t, phase, main_rss, children in timeline.rows:
        if t - last >= 5:
            print(f"  {t:7.1f} {phase:20s} {main_rss / GB:6.2f} {children / GB:6.2f}")
            last = t


if __name__ == "__main__":
    main()
