"""The Text-to-SQL agent for a real instruct model (SmolLM2-135M-Instruct): the LangGraph writer ->
run -> checker -> rewriter loop of `sql_agent.py`, with prompts a person writes for an instruct model.

Each role gets a system instruction and one demonstration exchange (a question of a training
database, never a held-out one) before the real request. The roles call the model through their own
agent URLs (`llm.for_agent(role)`), so the trainer trains the writer and the rewriter and keeps the
checker frozen; with per-role LoRA each trained role has its own adapter (config_smollm2_lora.toml).
"""

from __future__ import annotations

from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI
from langgraph.graph import END, START, StateGraph
from sql_agent import MAX_ROUNDS, SqlState, chat_model, run_preview
from sql_data import database_path, execution_match, extract_sql

from reinforge import LLM, agent
from reinforge.demo.agent import sampling_from

DEMO_SCHEMA = (
    "ridge(ridge_id, name, mallet, birth_year) | summit_cup(summit_cup_id, ridge_id -> ridge, title, "
    "genre, badger)"
)
DEMO_QUESTION = "List the name of each ridge whose mallet is 'Mexico'."
DEMO_SQL = "SELECT name FROM ridge WHERE mallet = 'Mexico'"
"""A question of a training-split database (`sql_data.generate_tasks("train", ...)`)."""

WRITER_SYSTEM = "You write one SQLite query that answers the question. Reply with the query only."
CHECKER_SYSTEM = (
    "You check a SQL query against the question and its rows. Reply OK if it is right, else WRONG."
)
REWRITER_SYSTEM = "The SQL query below may be wrong. Reply with a corrected SQLite query only."


def writer_messages(schema: str, question: str) -> list[BaseMessage]:
    return [
        SystemMessage(WRITER_SYSTEM),
        HumanMessage(f"Schema: {DEMO_SCHEMA}\nQuestion: {DEMO_QUESTION}"),
        AIMessage(DEMO_SQL),
        HumanMessage(f"Schema: {schema}\nQuestion: {question}"),
    ]


def checker_messages(question: str, sql: str, preview: str) -> list[BaseMessage]:
    return [
        SystemMessage(CHECKER_SYSTEM),
        HumanMessage(f"Question: {DEMO_QUESTION}\nSQL: {DEMO_SQL}\nRows: Ada; Bram"),
        AIMessage("OK"),
        HumanMessage(f"Question: {question}\nSQL: {sql}\nRows: {preview}"),
    ]


def rewriter_messages(schema: str, question: str, sql: str, preview: str) -> list[BaseMessage]:
    return [
        SystemMessage(REWRITER_SYSTEM),
        HumanMessage(
            f"Schema: {DEMO_SCHEMA}\nQuestion: {DEMO_QUESTION}\n"
            "SQL: SELECT title FROM summit_cup WHERE mallet = 'Mexico'\nRows: error: no such column: mallet"
        ),
        AIMessage(DEMO_SQL),
        HumanMessage(f"Schema: {schema}\nQuestion: {question}\nSQL: {sql}\nRows: {preview}"),
    ]


def build_graph(writer: ChatOpenAI, checker: ChatOpenAI, rewriter: ChatOpenAI) -> Any:
    async def write(state: SqlState) -> dict[str, Any]:
        reply = await writer.ainvoke(writer_messages(state["schema"], state["question"]))
        return {"sql": extract_sql(str(reply.content)), "rounds": 1}

    def execute(state: SqlState) -> dict[str, Any]:
        return {"preview": run_preview(state["db_id"], state["sql"])}

    async def check(state: SqlState) -> dict[str, Any]:
        reply = await checker.ainvoke(checker_messages(state["question"], state["sql"], state["preview"]))
        return {"verdict": str(reply.content).strip()}

    async def rewrite(state: SqlState) -> dict[str, Any]:
        messages = rewriter_messages(state["schema"], state["question"], state["sql"], state["preview"])
        reply = await rewriter.ainvoke(messages)
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


@agent
async def sql_smollm2_agent(task: dict[str, Any], llm: LLM) -> float:
    """Execution accuracy of the last query: 1.0 when its rows match the gold query's."""
    limit = int(sampling_from(llm).get("max_tokens", 96))
    graph = build_graph(
        chat_model(llm, "writer", limit), chat_model(llm, "checker", 4), chat_model(llm, "rewriter", limit)
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
