"""A two-role LangGraph graph, of which only one role is trained: no `for_agent`, no code change.

A `solver` node works the calc task with the calculator (a `ToolNode` runs its calls), then a
`checker` node, the same model behind another prompt, reviews the answer. Both call the one base
URL reinforge hands the agent. The runner reads LangGraph's own callbacks, so each LLM call is
recorded under the node that made it, and `train_calc(..., trained_roles=["solver"])` trains the
solver's calls while the checker stays frozen (its calls are counted as filtered in the metrics).

    .venv/bin/python examples/frameworks/langgraph_two_roles.py [--minutes 5]
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AnyMessage, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition

from reinforge import LLM, agent
from reinforge.demo.agent import TOOL_ERROR_TEXT, parse_answer, sampling_from
from reinforge.demo.calculator import call_calculator

MAX_TURNS = 4


@tool
def calculator(expression: str) -> str:
    """Compute a op b"""
    return str(call_calculator(json.dumps({"expression": expression})))


class State(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    verdict: str


def build_graph(model: ChatOpenAI) -> Any:
    solver_model = model.bind_tools([calculator])

    async def solver(state: State) -> dict[str, Any]:
        return {"messages": [await solver_model.ainvoke(state["messages"])]}

    async def checker(state: State) -> dict[str, Any]:
        answer = str(state["messages"][-1].content)
        review = await model.ainvoke([HumanMessage(f"Check: {answer}")])
        return {"verdict": str(review.content)}

    graph = StateGraph(State)
    graph.add_node("solver", solver)
    graph.add_node("tools", ToolNode([calculator], handle_tool_errors=TOOL_ERROR_TEXT))
    graph.add_node("checker", checker)
    graph.add_edge(START, "solver")
    graph.add_conditional_edges("solver", tools_condition, {"tools": "tools", END: "checker"})
    graph.add_edge("tools", "solver")
    graph.add_edge("checker", END)
    return graph.compile()


@agent
async def calc_agent(task: dict[str, Any], llm: LLM) -> float:
    """The solver's answer earns the reward; the checker only reviews it."""
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
    state = await build_graph(model).ainvoke(
        {"messages": [HumanMessage(str(task["question"]))], "verdict": ""},
        {"recursion_limit": 2 * MAX_TURNS + 2},
    )
    solved = [m for m in state["messages"] if m.type == "ai"][-1]
    return 1.0 if parse_answer(str(solved.content)) == int(task["answer"]) else 0.0


def main() -> None:
    from train_calc import train_calc  # beside this script (run as a script, its folder is on sys.path)

    train_calc(calc_agent, "langgraph_two_roles", trained_roles=["solver"])


if __name__ == "__main__":
    main()
