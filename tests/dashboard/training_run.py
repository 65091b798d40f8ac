"""A real small training run for the dashboard tests (and the screenshot script): a tiny Llama trained
for two steps by `Trainer.fit` on an agent that makes two LLM calls around a traced tool call, emits an
intermediate reward, and sometimes has its tool fail (an AIR signal)."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from openai import AsyncOpenAI
from transformers import PreTrainedTokenizerFast

from reinforge import emit_reward, span
from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.demo.calculator import CALCULATOR_TOOL, CalculatorError, calculate
from reinforge.demo.tasks import generate_tasks
from reinforge.demo.traces import corpus_text, synthetic_traces
from reinforge.models import build_tokenizer, tiny_llama
from reinforge.runner import LLM, agent
from reinforge.training import Trainer

AGENT_NAME = "solver"


@lru_cache(maxsize=1)
def calc_tokenizer() -> PreTrainedTokenizerFast:
    traces = synthetic_traces(generate_tasks("train", 300, seed=0))
    return build_tokenizer(corpus_text(traces, [CALCULATOR_TOOL]), vocab_size=300)


@lru_cache(maxsize=1)
def no_broken_text() -> dict[str, int]:
    """logit_bias banning the tokens that decode to part of a UTF-8 character. A tiny random model
    emits them freely; a reply holding half a character comes back as U+FFFD in the agent's next
    request, which the gateway cannot match to the tokens it generated, so the two calls would never
    merge (and the run would have no masked tool result to show). Built in each process that runs the
    agent (runners may be child processes)."""
    tokenizer = calc_tokenizer()
    return {str(i): -100 for i in range(len(tokenizer)) if "\ufffd" in tokenizer.decode([i])}


# Every third training question is one the calculator refuses (a tool error, hence an AIR signal).
TRAIN = [{"task_id": f"t{i}", "question": f"{i}+{i}*2" if i % 3 == 0 else f"{i}+{i + 1}"} for i in range(12)]
VAL = [{"task_id": f"v{i}", "question": f"{i}*3"} for i in range(2)]


@agent(name=AGENT_NAME)
async def tool_agent(task: dict[str, Any], llm: LLM) -> float:
    """Ask, call the calculator (a tool span; it refuses some tasks), send its result back, ask again.
    Reward 1 when the second reply has an even length: random enough for GRPO groups to differ."""
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    try:
        messages: list[dict[str, Any]] = [{"role": "user", "content": str(task["question"])}]
        first = await client.chat.completions.create(
            model=llm.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=1.0,
            max_tokens=6,
            logit_bias=no_broken_text(),
        )
        reply = first.choices[0].message.content or ""
        try:
            with span("calculator", kind="tool", expression=str(task["question"])) as s:
                result = str(calculate(str(task["question"])))
                s.set_attribute("result", result)
        except CalculatorError as exc:
            result = f"error: {exc}"
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": f"result {result}"}]
        second = await client.chat.completions.create(
            model=llm.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=1.0,
            max_tokens=6,
            logit_bias=no_broken_text(),
        )
        emit_reward(0.1, name="answered")
        return float(len(second.choices[0].message.content or "") % 2 == 0)
    finally:
        await client.close()


def train_small_run(run_dir: Path, *, steps: int = 2) -> Path:
    """Train `steps` steps into `run_dir` (SQLite store, metrics, transitions) and return it."""
    torch.set_num_threads(1)
    tokenizer = calc_tokenizer()
    model = tiny_llama(tokenizer, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, seed=0)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():  # scaled-up weights sample varied text, so rewards (and advantages) differ
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, 0.2, generator=gen)
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=4),
        credit=CreditConfig(mode="merged", assignment="equal+emitted+air"),
        run_dir=run_dir,
        progress=False,
        optim={"learning_rate": 1e-2},
        rollouts={"tasks_per_step": 2, "max_tokens": 6},
        runners={"concurrency": 16},
        engine={"max_batch_size": 16, "max_seq_len": 128},
        schedule={"max_steps": steps, "val_every": 1, "val_greedy": False},
        checkpoints={"every": 0},
    )
    trainer.fit(tool_agent, TRAIN, VAL)
    return run_dir
