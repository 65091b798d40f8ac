"""The demo's calc agent written as a LangGraph ReAct agent, trained with RL unchanged.

The agent is LangGraph as its docs write it: `create_react_agent` over `ChatOpenAI` with a `@tool`
calculator. reinforge gives it only a base URL and a key. What makes it train like the demo's own
agent happens in the gateway: LangChain sends each tool call back re-serialised
(`{"expression": "1*3"}` for the `{"expression":"1*3"}` the model wrote), and the gateway renders the
turn as the model generated it, so the conversation's calls merge into one sample (merge rate 1.0).
A calculator error is raised by the tool: the runner sees it through LangChain's callbacks and it
becomes an Automatic Intermediate Reward signal on the call that asked for it.

    .venv/bin/python examples/frameworks/langgraph_calc.py [--minutes 5] [--run-dir runs/langgraph-calc]

Ends with `RESULT langgraph_calc_heldout before=<a> after=<b> merge_rate=<m>` (held-out sampled
success before and after training, and the merge rate over the run's steps).
"""

from __future__ import annotations

import json
from typing import Any

from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import ToolNode, create_react_agent

from reinforge import LLM, agent
from reinforge.demo.agent import TOOL_ERROR_TEXT, parse_answer, sampling_from
from reinforge.demo.calculator import call_calculator

MAX_TURNS = 4


@tool
def calculator(expression: str) -> str:
    """Compute a op b"""
    return str(call_calculator(json.dumps({"expression": expression})))


@agent
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """Solve `task["question"]` with a LangGraph ReAct agent; 1.0 for the exact answer."""
    sampling = sampling_from(llm)
    model = ChatOpenAI(
        base_url=llm.base_url,
        api_key=llm.api_key,
        model=llm.model,
        temperature=float(sampling.get("temperature", 1.0)),
        max_tokens=int(sampling.get("max_tokens", 64)),
        max_retries=1,
        timeout=120,
    )
    graph = create_react_agent(model, ToolNode([calculator], handle_tool_errors=TOOL_ERROR_TEXT))
    state = await graph.ainvoke(
        {"messages": [("user", str(task["question"]))]},
        {"recursion_limit": 2 * MAX_TURNS + 1},
    )
    answer = state["messages"][-1]
    return 1.0 if parse_answer(str(answer.content)) == int(task["answer"]) else 0.0


def main() -> None:
    from train_calc import train_calc  # beside this script (run as a script, its folder is on sys.path)

    train_calc(calc_agent, "langgraph_calc")


if __name__ == "__main__":
    main()
