"""The multi-hop retrieval agent in the OpenAI Agents SDK: an `Agent` with a `search` tool.

Written as the SDK's docs write it (a `function_tool`, `Runner.run`, a chat-completions model on a
base URL); reinforge hands it the URL and a key. The search runs SQLite FTS5 over a generated corpus
of fictional entities, so the answers can only come from what the agent retrieves. The reward is the
paper's: 0.9 x answer F1 + 0.1 x format.
"""

from __future__ import annotations

from typing import Any

from agents import Agent, MaxTurnsExceeded, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool
from openai import AsyncOpenAI
from rag_data import rag_reward
from rag_data import search as search_corpus

from reinforge import LLM, agent
from reinforge.demo.agent import sampling_from

MAX_TURNS = 5
TOP_K = 1
"""Documents per search: the entity's own page ranks first (titles weigh most), and one page keeps
the tiny model's prompt short."""


@function_tool(failure_error_function=lambda _context, _error: "error: search failed")
def search(query: str) -> str:
    """Search the wiki"""
    found = search_corpus(query, k=TOP_K)
    return "\n".join(found) if found else "no results"


@agent
async def rag_agent(task: dict[str, Any], llm: LLM) -> float:
    """0.9 x F1 of the final answer against the gold answer + 0.1 for a well-formed `ANSWER:` line."""
    sampling = sampling_from(llm)
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=1, timeout=120)
    researcher = Agent(
        name="researcher",
        tools=[search],
        model=OpenAIChatCompletionsModel(model=llm.model, openai_client=client),
        model_settings=ModelSettings(
            temperature=float(sampling.get("temperature", 1.0)),
            max_tokens=int(sampling.get("max_tokens", 48)),
        ),
    )
    try:
        result = await Runner.run(researcher, str(task["question"]), max_turns=MAX_TURNS)
    except MaxTurnsExceeded:
        return 0.0
    finally:
        await client.close()
    return rag_reward(str(result.final_output), str(task["answer"]))
