"""The scale bench's async section (`scale_bench.py --async-only`): wall time per trained step,
synchronous (`max_staleness = 0`) against asynchronous with bounded staleness (`max_staleness = 2`),
same model, seed, data and RL budget, and the held-out reward each run ends with.

The agent is calc-style: a question, an LLM call, a tool, a second LLM call with the tool's answer.
The tool's latency is heavy-tailed, as real tools are: most calls take 20 ms, one in ten takes 1.5 s
(a slow search, a cold sandbox). A synchronous step waits for its slowest rollout, so nearly every
step pays the tail; the asynchronous one trains the groups that are complete and leaves the slow
ones in flight. The reward is graded (the share of digit characters in the replies: the answer is a
number), so a few steps move it and the two runs' held-out rewards can be compared.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

import torch
from openai import AsyncOpenAI

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.tasks import generate_tasks
from reinforge.demo.traces import corpus_text, synthetic_traces
from reinforge.models import build_tokenizer, tiny_llama
from reinforge.net.openai_client import gateway_http_client
from reinforge.runner import LLM, agent
from reinforge.training import Trainer, TrainerConfig

FAST_TOOL_S = 0.02
SLOW_TOOL_S = 1.5
SLOW_SHARE = 0.1


def tool_latency(rng: random.Random) -> float:
    """Heavy-tailed: most calls fast, a few slow."""
    return SLOW_TOOL_S if rng.random() < SLOW_SHARE else FAST_TOOL_S


def digit_share(text: str) -> float:
    return sum(c.isdigit() for c in text) / len(text) if text else 0.0


@agent(name="calc-slow-tool")
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, http_client=gateway_http_client())
    try:
        messages: list[Any] = [{"role": "user", "content": f"What is {task['question']}?"}]
        first = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=8)
        draft = first.choices[0].message.content or ""
        await asyncio.sleep(tool_latency(random.Random()))  # the calculator
        messages += [
            {"role": "assistant", "content": draft},
            {"role": "user", "content": "The tool says 42."},
        ]
        second = await client.chat.completions.create(model=llm.model, messages=messages, max_tokens=8)
        return digit_share(draft + (second.choices[0].message.content or ""))
    finally:
        await client.close()


def _model_and_tokenizer(seed: int = 0) -> tuple[Any, Any]:
    tokenizer = build_tokenizer(
        corpus_text(synthetic_traces(generate_tasks("train", 300, seed=0)), [CALCULATOR_TOOL]), vocab_size=300
    )
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # scaled up so sampling gives varied text (and rewards)
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=gen)
    return model, tokenizer


def _fit(
    run_dir: Path, max_staleness: int, steps: int, tasks: list[dict[str, Any]], val: list[dict[str, Any]]
) -> Any:
    model, tokenizer = _model_and_tokenizer()
    config = TrainerConfig.model_validate(
        {
            "run_dir": run_dir,
            "progress": False,
            "optim": {"learning_rate": 2e-2},
            "rollouts": {"tasks_per_step": 4, "max_tokens": 8},
            "runners": {"concurrency": 64},
            "engine": {"max_batch_size": 64, "max_seq_len": 128},
            "schedule": {
                "max_steps": steps,
                "val_every": 0,
                "val_greedy": False,
                "max_staleness": max_staleness,
            },
            "checkpoints": {"every": 0},
        }
    )
    trainer = Trainer(
        model, tokenizer, algorithm=GRPO(group_size=4), credit=CreditConfig(mode="per_call"), config=config
    )
    return trainer.fit(calc_agent, tasks, val)


def _per_step_s(history: list[dict[str, Any]]) -> float:
    """Mean wall time of a trained step, the first (engine warm-up, the pool filling) left out."""
    times = [r["time/step_s"] for r in history if "train/reward" in r][1:]
    return statistics.fmean(times)


def run(steps: int, val_tasks: int, rounds: int) -> dict[str, float]:
    """Sync then async (k=2), `rounds` times each; prints progress, returns the RESULT values."""
    tasks = [
        {"task_id": f"q{i}", "question": t.question}
        for i, t in enumerate(generate_tasks("train", 200, seed=1))
    ]
    val = [
        {"task_id": f"v{i}", "question": t.question}
        for i, t in enumerate(generate_tasks("val", val_tasks, seed=2))
    ]
    sync_s: list[float] = []
    async_s: list[float] = []
    sync_val: list[float] = []
    async_val: list[float] = []
    dropped = 0.0
    with tempfile.TemporaryDirectory(prefix="reinforge-async-") as tmp:
        for r in range(rounds):
            for k in (0, 2):
                result = _fit(Path(tmp) / f"r{r}-k{k}", k, steps, tasks, val)
                per_step = _per_step_s(result.history)
                reward = result.val_after["val/reward"]
                (sync_s if k == 0 else async_s).append(per_step)
                (sync_val if k == 0 else async_val).append(reward)
                steps_done = [h for h in result.history if "train/reward" in h]
                extra = ""
                if k:
                    last = steps_done[-1]
                    dropped += last["staleness/dropped_total"]
                    total = last["staleness/dropped_total"] + last["staleness/trained_total"]
                    extra = (
                        f"  staleness mean {last['staleness/mean_total']:.2f}"
                        f" max {last['staleness/max_total']:.0f}"
                        f"  dropped {last['staleness/dropped_total']:.0f} of {total:.0f} transitions"
                    )
                label = "async k=2" if k else "sync"
                print(
                    f"round {r + 1} {label:>9}: {per_step:.3f} s/step, held-out reward "
                    f"{result.val_before['val/reward']:.3f} -> {reward:.3f}{extra}",
                    flush=True,
                )
    speedups = [s / a for s, a in zip(sync_s, async_s, strict=True)]
    return {
        "async_sync_s_per_step": statistics.median(sync_s),
        "async_k2_s_per_step": statistics.median(async_s),
        "async_speedup": statistics.median(speedups),
        "async_sync_val_reward": statistics.fmean(sync_val),
        "async_k2_val_reward": statistics.fmean(async_val),
        "async_val_reward_gap": abs(statistics.fmean(sync_val) - statistics.fmean(async_val)),
        "async_dropped_transitions": dropped,
    }
