"""An agent that sets its own sampling, and never reads the run's, still validates greedily: the
gateway applies the run's sampling for the phase. Its greedy held-out success before training
equals the demo agent's (the demo's warm start; greedy decoding is deterministic), and its spans
record the temperature it asked for beside the one applied."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from openai import AsyncOpenAI

from reinforge import semconv
from reinforge.demo.agent import MAX_TURNS, compact, parse_answer, run_tool
from reinforge.demo.agent import calc_agent as demo_agent
from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.tasks import val_tasks
from reinforge.demo.traces import tool_result_message
from reinforge.demo.warm_start import load_warm_start
from reinforge.runner import LLM, agent
from reinforge.store.factory import open_store
from reinforge.training import Trainer, TrainerConfig
from reinforge.types import MAX_PAGE_SIZE, SpanQuery


@agent(name="own-sampling")
async def own_sampling_agent(task: dict[str, Any], llm: LLM) -> float:
    """The demo's calc agent as a framework user would write it: its own temperature and max_tokens,
    the run's resources never read."""
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": str(task["question"])}]
    try:
        for _ in range(MAX_TURNS):
            response = await client.chat.completions.create(
                model=llm.model, messages=messages, tools=[CALCULATOR_TOOL], temperature=1.7, max_tokens=200
            )  # type: ignore[list-item]
            message = response.choices[0].message
            calls = [c for c in message.tool_calls or [] if c.type == "function"]
            if not calls:
                return 1.0 if parse_answer(message.content) == int(task["answer"]) else 0.0
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.function.name, "arguments": compact(c.function.arguments)},
                        }
                        for c in calls
                    ],
                }
            )
            messages += [
                tool_result_message(c.id, run_tool(c.function.name, c.function.arguments)) for c in calls
            ]
        return 0.0
    finally:
        await client.close()


def validate(agent_fn: Any, run_dir: Path) -> dict[str, float]:
    model, tokenizer = load_warm_start()
    config = TrainerConfig(
        run_dir=run_dir,
        progress=False,
        rollouts={"max_tokens": 48},
        schedule={"max_steps": 0, "val_every": 0},
        checkpoints={"every": 0, "resume": False},
    )
    fit = Trainer(model, tokenizer, config=config).fit(
        agent_fn, [{"question": "1+1", "answer": 2}], val_tasks(24)
    )
    return fit.val_before


async def greedy_spans(run_dir: Path) -> list[dict[str, Any]]:
    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        page = await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=MAX_PAGE_SIZE))
    finally:
        await store.close()
    return [s.attributes for s in page.items if "greedy" in s.rollout_id]


def test_an_agent_with_its_own_sampling_validates_greedily(tmp_path: Path) -> None:
    demo = validate(demo_agent, tmp_path / "demo")
    own = validate(own_sampling_agent, tmp_path / "own")
    assert own["val/greedy_success"] == demo["val/greedy_success"]
    spans = asyncio.run(greedy_spans(tmp_path / "own"))
    assert spans
    for attributes in spans:
        assert attributes[semconv.ATTR_SAMPLING_ASKED]["temperature"] == 1.7
        assert attributes[semconv.ATTR_SAMPLING_APPLIED] == {
            "temperature": 0.0,
            "top_p": 1.0,
            "top_k": 0,
            "max_tokens": 48,
        }
        assert attributes[semconv.ATTR_SAMPLING_OWNER] == "run"
