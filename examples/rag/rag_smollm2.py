"""The multi-hop retrieval agent for a real instruct model (SmolLM2-135M-Instruct): the OpenAI Agents
SDK researcher with a `search` tool.

The same `Agent` and `function_tool` as `rag_agent.py`, with the prompt a person writes for a small
instruct model: instructions, and one demonstration dialogue passed as earlier input items (a
two-hop question from the training split answered with two searches). The base model almost never
calls a tool zero-shot; a demonstrated search is what gets it started (docs/demo.md). The reward is
the F1 of the answer, and only an answer given after at least one search counts: the entities are
fictional, so an answer without a search is a guess.
"""

from __future__ import annotations

import json
from typing import Any

from agents import Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel, Runner
from agents.items import ToolCallOutputItem
from openai import AsyncOpenAI
from rag_agent import search
from rag_data import answer_f1, extract_answer

from reinforge import LLM, agent
from reinforge.demo.agent import sampling_from

MAX_TURNS = 5
INSTRUCTIONS = (
    "You answer questions about a wiki of made-up people, books and companies. Use the search tool "
    "to look up each name, one search at a time. Finish with ANSWER: followed by the answer."
)
DEMO_QUESTION = "In which city was the author of Morter Chronicle born?"
"""A two-hop question of the training split (`rag_data.generate_tasks("train", ...)`), never held out."""
DEMO_PAGES = (
    ("Morter Chronicle", "Morter Chronicle is a book written by Kape Sidar. The story is set in Bobror."),
    (
        "Kape Sidar",
        "Kape Sidar was born in Vilkas. Kape Sidar was a student of Doxbru Tanda. "
        "Kape Sidar works at Pense Textiles.",
    ),
)


def demonstration() -> list[Any]:
    """The demonstration as Agents SDK input items: the question, two searches and their pages, the answer."""
    items: list[Any] = [{"role": "user", "content": DEMO_QUESTION}]
    for i, (query, page) in enumerate(DEMO_PAGES):
        call_id = f"call_demo_{i}"
        arguments = json.dumps({"query": query}, separators=(",", ":"))
        items.append({"type": "function_call", "call_id": call_id, "name": "search", "arguments": arguments})
        items.append({"type": "function_call_output", "call_id": call_id, "output": page})
    items.append({"role": "assistant", "content": "ANSWER: Vilkas"})
    return items


@agent(name="researcher")
async def rag_smollm2_agent(task: dict[str, Any], llm: LLM) -> float:
    """F1 of the final answer against the gold answer, when the researcher searched at least once."""
    sampling = sampling_from(llm)
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1, timeout=900)
    researcher = Agent(
        name="researcher",
        instructions=INSTRUCTIONS,
        tools=[search],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
        model_settings=ModelSettings(
            temperature=float(sampling.get("temperature", 1.0)),
            max_tokens=int(sampling.get("max_tokens", 40)),
        ),
    )
    question = {"role": "user", "content": str(task["question"])}
    try:
        result = await Runner.run(researcher, [*demonstration(), question], max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        return 0.0
    finally:
        await client.close()
    searched = any(isinstance(item, ToolCallOutputItem) for item in result.new_items)
    return answer_f1(extract_answer(str(result.final_output)), str(task["answer"])) if searched else 0.0
