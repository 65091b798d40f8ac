"""One policy update of the real demo's policy on synthetic GRPO groups: its time and how far the
process's RSS rises, for a micro-batch budget, a frozen base dtype and the trim loop (docs/demo.md).

    flock /tmp/heavy.lock env PYTHONPATH=$PWD/src .venv/bin/python benchmarks/real_demo_update_memory.py \
        GROUPS MICRO_BATCH_TOKENS trim|none float32|compute [mmap1mb|default]

The last argument: glibc's mmap threshold pinned at 1 MB with two arenas (`release_large_blocks`, the
default) or glibc's own dynamic threshold; `sys` is the kernel CPU time, where fresh mappings' page
faults show.
"""

from __future__ import annotations

import contextlib
import random
import sys
import threading
import time
from typing import Literal, cast

import psutil
import torch
from transformers import AutoModelForCausalLM

from reinforge.algorithms import GRPO
from reinforge.models import resolve_model
from reinforge.training.config import LoraSettings, OptimSettings
from reinforge.training.device import Placement
from reinforge.training.memory import TrimFreedMemory, release_large_blocks
from reinforge.training.policy import Policy
from reinforge.types import Transition


def synthetic_groups(groups: int) -> list[Transition]:
    """GRPO groups shaped like the demo's: a ~390-token prompt, 8 episodes of 40-80 tokens with a
    masked tool result, half rewarded."""
    rng = random.Random(0)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(1000, 40000) for _ in range(390 + g)]
        for r in range(8):
            n = rng.randrange(40, 80)
            mask = [1] * 25 + [0] * 10 + [1] * (n - 35)
            out.append(
                Transition(
                    rollout_id=f"r{g}-{r}",
                    attempt_id="a",
                    group_id=f"g{g}",
                    prompt_ids=prompt,
                    response_ids=[rng.randrange(1000, 40000) for _ in range(n)],
                    response_mask=mask,
                    behaviour_logprobs=[-1.0 if m else 0.0 for m in mask],
                    reward=float(r % 2),
                    advantage=float(r % 2) - 0.5,
                )
            )
    return out


def main() -> None:
    groups, budget, trim = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "trim"
    base = cast(Literal["float32", "compute"], sys.argv[4])
    mmap_small = len(sys.argv) < 6 or sys.argv[5] == "mmap1mb"
    if mmap_small:
        release_large_blocks()
    torch.set_num_threads(2)
    me = psutil.Process()
    peak = [0]

    def watch() -> None:
        while True:
            peak[0] = max(peak[0], me.memory_info().rss)
            time.sleep(0.02)

    threading.Thread(target=watch, daemon=True).start()
    model = AutoModelForCausalLM.from_pretrained(resolve_model("smollm2-135m-instruct"), dtype=torch.float32)
    torch.manual_seed(0)
    policy = Policy(
        model,
        GRPO(group_size=8, loss_agg="seq-mean-token-mean", seq_unit="rollout"),
        OptimSettings(
            learning_rate=3e-4, micro_batch_tokens=budget, lora=LoraSettings(r=16, alpha=32, base_dtype=base)
        ),
        pad_token_id=0,
        placement=Placement(torch.device("cpu"), torch.bfloat16),
    )
    batch = synthetic_groups(groups)
    policy.update(batch[:8])  # warm-up
    before = me.memory_info().rss
    peak[0] = before
    with TrimFreedMemory() if trim else contextlib.nullcontext():
        started = time.perf_counter()
        metrics = policy.update(batch)
        seconds = time.perf_counter() - started
    print(
        f"groups={groups} mbt={budget} trim={trim} base={base} mmap1mb={mmap_small}: update {seconds:.1f}s, "
        f"{metrics['update/micro_batches']:.0f} micro-batches, rss before {before / 1e9:.2f} "
        f"peak {peak[0] / 1e9:.2f} GB, sys {me.cpu_times().system:.1f}s",
        flush=True,
    )


if __name__ == "__main__":
    main()
