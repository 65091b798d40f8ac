"""The Text-to-SQL agent in LangGraph: write a query, run it, check the result, rewrite or answer.

Three roles share one model: the `writer` drafts the query, the `checker` reviews the query with the
rows it returned, and the `rewriter` fixes a query the checker rejected (at most `MAX_ROUNDS` queries
in all). Each role calls the model through its own agent URL (`llm.for_agent(role)`), the one line
that tells reinforge which role made a call: the trainer then trains the writer and the rewriter and
keeps the checker frozen, and with per-role LoRA the engine serves each role its own adapter.
"""

from __future__ import annotations

import sqlite3
from typing import Any, Literal, TypedDict

from langchain_core.messages import HumanMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from sql_data import database_path, execution_match, extract_sql

from reinforge import LLM, agent
from reinforge.demo.agent import sampling_from

MAX_ROUNDS = 3
PREVIEW_ROWS = 3


class SqlState(TypedDict):
    schema: str
    question: str
    db_id: str
    sql: str
    preview: str
    verdict: str
    rounds: int


def writer_prompt(schema: str, question: str) -> str:
    return f"{schema}\nQ: {question}"


def checker_prompt(question: str, sql: str, preview: str) -> str:
    return f"Q: {question}\nSQL: {sql}\nRows: {preview}"


def rewriter_prompt(schema: str, question: str, sql: str, preview: str) -> str:
    return f"{schema}\nQ: {question}\nSQL: {sql}\nRows: {preview}\nFix:"


def run_preview(db_id: str, sql: str) -> str:
    """The first rows the query returns, compactly, or the error it raised (what the checker sees)."""
    try:
        with sqlite3.connect(f"file:{database_path(db_id)}?mode=ro", uri=True) as conn:
            rows = conn.execute(sql).fetchmany(PREVIEW_ROWS + 1)
    except sqlite3.Error as exc:
        return f"error: {str(exc)[:60]}"
    if not rows:
        return "none"
    shown = "; ".join(", ".join(str(v) for v in row) for row in rows[:PREVIEW_ROWS])
    return shown + (" ..." if len(rows) > PREVIEW_ROWS else "")


def build_graph(writer: ChatOpenAI, checker: ChatOpenAI, rewriter: ChatOpenAI) -> Any:
    async def write(state: SqlState) -> dict[str, Any]:
        reply = await writer.ainvoke([HumanMessage(writer_prompt(state["schema"], state["question"]))])
        return {"sql": extract_sql(str(reply.content)), "rounds": 1}

    def execute(state: SqlState) -> dict[str, Any]:
        return {"preview": run_preview(state["db_id"], state["sql"])}

    async def check(state: SqlState) -> dict[str, Any]:
        prompt = checker_prompt(state["question"], state["sql"], state["preview"])
        reply = await checker.ainvoke([HumanMessage(prompt)])
        return {"verdict": str(reply.content).strip()}

    async def rewrite(state: SqlState) -> dict[str, Any]:
        prompt = rewriter_prompt(state["schema"], state["question"], state["sql"], state["preview"])
        reply = await rewriter.ainvoke([HumanMessage(prompt)])
        return {"sql": extract_sql(str(reply.content)), "rounds": state["rounds"] + 1}

    def after_check(state: SqlState) -> Literal["rewrite", "__end__"]:
        rejected = not state["verdict"].upper().startswith("OK")
        return "rewrite" if rejected and state["rounds"] < MAX_ROUNDS else END

    graph = StateGraph(SqlState)
    graph.add_node("write", write)
    graph.add_node("execute", execute)
    graph.add_node("check", check)
    graph.add_node("rewrite", rewrite)
    graph.add_edge(START, "write")
    graph.add_edge("write", "execute")
    graph.add_edge("execute", "check")
    graph.add_conditional_edges("check", after_check, {"rewrite": "rewrite", END: END})
    graph.add_edge("rewrite", "execute")
    return graph.compile()


def chat_model(llm: LLM, role: str, max_tokens: int) -> ChatOpenAI:
    role_llm = llm.for_agent(role)
    sampling = sampling_from(llm)
    return ChatOpenAI(
        base_url=role_llm.base_url,
        api_key=role_llm.api_key,
        model=role_llm.model,
        temperature=float(sampling.get("temperature", 1.0)),
        max_tokens=max_tokens,
        max_retries=1,
        timeout=120,
    )


@agent
async def sql_agent(task: dict[str, Any], llm: LLM) -> float:
    """Execution accuracy of the last query: 1.0 when its rows match the gold query's."""
    limit = int(sampling_from(llm).get("max_tokens", 64))
    graph = build_graph(
        chat_model(llm, "writer", limit), chat_model(llm, "checker", 8), chat_model(llm, "rewriter", limit)
    )
    state = await graph.ainvoke(
        {
            "schema": task["schema"],
            "question": task["question"],
            "db_id": task["db_id"],
            "sql": "",
            "preview": "",
            "verdict": "",
            "rounds": 0,
        },
        {"recursion_limit": 4 * MAX_ROUNDS + 2},
    )
    return execution_match(database_path(task["db_id"]), state["sql"], task["gold_sql"])
