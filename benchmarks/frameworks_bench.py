"""What training through reinforge costs a framework agent: rollouts/s through the spine vs direct.

For each installed framework (LangGraph, the OpenAI Agents SDK with its chat and Responses models,
AutoGen, the Anthropic SDK), one agent written the framework's way with one no-op tool: the model
calls the tool, sees its result, answers. The model is `baselines/tool_loop_upstream.py`, a scripted
server with exact token ids that answers in microseconds, so the frameworks' own code and reinforge's
are all that is measured. Each framework's agent runs two ways in this process:
- direct: the agent's client pointed at the upstream, N runs at concurrency C;
- spine: the same agent run by a reinforge `Runner` (in-process, frameworks' telemetry on), leasing
  from the store server (SQLite) with the gateway mounted and fronting the same upstream
  (`UpstreamBackend`), N rollouts at concurrency C.
The two sides alternate for R rounds (direct first in odd rounds, spine first in even ones), and the
slowdown is 1 - median(spine)/median(direct) rollouts/s. Why rounds: one run of each side moves by
several percent between repeats on a quiet machine, and the result takes the worst of five
frameworks, so a single pair per framework reads the noise's largest swing as the slowdown
(docs/agents.md has the figures). Each framework's merge rate is read back from the store with
`reinforge.credit` (merged mode) after every spine run, the lowest kept: 1.0 when every call's
prompt extends the previous call's tokens, which needs the history the framework sends back to
render as generated.

    .venv/bin/python benchmarks/frameworks_bench.py [--quick] [--rollouts N] [--concurrency C] [--rounds R]

Ends with `RESULT framework_overhead_max_pct=<x>` (the worst framework's slowdown; goal <= 10) and
`RESULT framework_merge_rate_min=<m>` (goal 1.0), after one line per framework.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _agl import BASELINES, free_port, wait_http
from rollout_bench import GATEWAY_MOUNT, SpineServer

from reinforge.credit import CreditConfig, build_transitions
from reinforge.runner import Runner
from reinforge.runner.llm import LLM
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import AttemptQuery, RolloutQuery, RolloutSpec, SpanQuery

AgentFn = Callable[[dict[str, Any], LLM], Awaitable[float]]
QUESTION = "Check the weather."


def noop() -> str:
    """Do nothing and say so."""
    return "ok"


def langgraph_agent() -> AgentFn:
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.prebuilt import create_react_agent

    noop_tool = tool(noop)

    async def run(task: dict[str, Any], llm: LLM) -> float:
        model = ChatOpenAI(base_url=llm.base_url, api_key=llm.api_key, model=llm.model, max_retries=0)
        state = await create_react_agent(model, [noop_tool]).ainvoke({"messages": [("user", QUESTION)]})
        return 1.0 if state["messages"][-1].content == "done" else 0.0

    return run


def openai_agents_agent(api: str) -> AgentFn:
    from agents import Agent, OpenAIChatCompletionsModel, OpenAIResponsesModel, Runner, function_tool
    from openai import AsyncOpenAI

    noop_tool = function_tool(noop)
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel

    async def run(task: dict[str, Any], llm: LLM) -> float:
        client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
        agent = Agent(
            name="noop", tools=[noop_tool], model=model_class(model=llm.model, openai_client=client)
        )
        result = await Runner.run(agent, QUESTION, max_turns=4)
        return 1.0 if result.final_output == "done" else 0.0

    return run


def autogen_agent() -> AgentFn:
    from autogen_agentchat.agents import AssistantAgent
    from autogen_ext.models.openai import OpenAIChatCompletionClient

    info = {
        "vision": False,
        "function_calling": True,
        "json_output": False,
        "family": "unknown",
        "structured_output": False,
    }

    async def run(task: dict[str, Any], llm: LLM) -> float:
        client = OpenAIChatCompletionClient(
            model=llm.model, base_url=llm.base_url, api_key=llm.api_key, model_info=info, max_retries=0
        )
        try:
            agent = AssistantAgent("noop", model_client=client, tools=[noop], max_tool_iterations=2)
            result = await agent.run(task=QUESTION)
        finally:
            await client.close()
        return 1.0 if getattr(result.messages[-1], "content", None) == "done" else 0.0

    return run


def anthropic_agent() -> AgentFn:
    import anthropic

    tools = [
        {"name": "noop", "description": "Do nothing.", "input_schema": {"type": "object", "properties": {}}}
    ]

    async def run(task: dict[str, Any], llm: LLM) -> float:
        client = anthropic.AsyncAnthropic(base_url=llm.base_url.removesuffix("/v1"), api_key=llm.api_key)
        messages: list[dict[str, Any]] = [{"role": "user", "content": QUESTION}]
        for _ in range(4):
            reply = await client.messages.create(
                model=llm.model, max_tokens=64, messages=messages, tools=tools
            )  # type: ignore[arg-type]
            messages.append({"role": "assistant", "content": [b.model_dump() for b in reply.content]})
            uses = [b for b in reply.content if b.type == "tool_use"]
            if not uses:
                return 1.0 if reply.content and getattr(reply.content[0], "text", "") == "done" else 0.0
            messages.append(
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": u.id, "content": noop()} for u in uses
                    ],
                }
            )
        return 0.0

    return run


FRAMEWORKS: dict[str, tuple[str, Callable[[], AgentFn]]] = {
    "langgraph": ("langgraph", langgraph_agent),
    "openai_agents_chat": ("agents", lambda: openai_agents_agent("chat")),
    "openai_agents_responses": ("agents", lambda: openai_agents_agent("responses")),
    "autogen": ("autogen_agentchat", autogen_agent),
    "anthropic": ("anthropic", anthropic_agent),
}


async def run_direct(agent: AgentFn, upstream_url: str, n: int, concurrency: int) -> float:
    """Rollouts/s of the agent against the upstream itself (the same client code, no reinforge)."""
    llm = LLM(base_url=upstream_url + "/v1", api_key="direct", model="policy")
    gate = asyncio.Semaphore(concurrency)
    rewards: list[float] = []

    async def one(i: int) -> None:
        async with gate:
            rewards.append(await agent({"i": i}, llm))

    started = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    elapsed = time.perf_counter() - started
    if sum(rewards) != n:
        raise RuntimeError(f"direct: {n - sum(rewards):.0f} of {n} runs did not finish their tool loop")
    return n / elapsed


async def merge_rate(store: HttpStoreClient, sample: int) -> float:
    """The credit metrics' merge rate over `sample` finished rollouts (merged mode)."""
    rollouts = (await store.query_rollouts(RolloutQuery(limit=sample))).items
    merged = mismatched = 0
    for rollout in rollouts:
        spans = (await store.query_spans(SpanQuery(rollout_id=rollout.rollout_id, limit=1000))).items
        attempts = (await store.query_attempts(AttemptQuery(rollout_id=rollout.rollout_id))).items
        _, metrics = build_transitions(rollout, spans, CreditConfig(mode="merged"), attempts=attempts)
        merged, mismatched = merged + metrics.merged_calls, mismatched + metrics.merge_mismatches
    return merged / (merged + mismatched) if merged + mismatched else 0.0


async def run_spine(agent: AgentFn, upstream_url: str, n: int, concurrency: int) -> tuple[float, float]:
    """Rollouts/s of the agent run by a Runner through the store and gateway, and its merge rate."""
    with tempfile.TemporaryDirectory(prefix="reinforge-frameworks-bench-") as tmp:
        server = SpineServer(upstream_url, f"sqlite:///{Path(tmp) / 'store.db'}")
        store = HttpStoreClient(server.url, server.token)
        try:
            await store.enqueue_rollouts([RolloutSpec(task={"i": i}) for i in range(n)])
            runner = Runner(
                store,
                agent,
                server.url + GATEWAY_MOUNT,
                server.secret,
                concurrency=concurrency,
                poll_seconds=0.5,
                model="policy",
                drain_timeout_s=120,
            )
            started = time.perf_counter()
            stats = await runner.run(max_rollouts=n)
            elapsed = time.perf_counter() - started
            if stats.failed or stats.errors:
                raise RuntimeError(f"spine: {stats.failed} rollouts failed; first errors {stats.errors[:2]}")
            rate = await merge_rate(store, min(n, 32))
        finally:
            await store.close()
            server.stop()
    return n / elapsed, rate


async def bench(
    names: list[str], upstream_url: str, n: int, concurrency: int, rounds: int
) -> tuple[list[float], list[float]]:
    overheads: list[float] = []
    rates: list[float] = []
    for name in names:
        package, make = FRAMEWORKS[name]
        if importlib.util.find_spec(package) is None:
            print(f"{name}: not installed (pip install 'reinforge[frameworks]'); skipped")
            continue
        agent = make()
        await run_direct(agent, upstream_url, min(n, 20), concurrency)  # warm-up
        direct: list[float] = []
        spine: list[float] = []
        rate = 1.0
        for round_ in range(rounds):
            for side in ("direct", "spine") if round_ % 2 == 0 else ("spine", "direct"):
                if side == "direct":
                    direct.append(await run_direct(agent, upstream_url, n, concurrency))
                else:
                    per_s, merged = await run_spine(agent, upstream_url, n, concurrency)
                    spine.append(per_s)
                    rate = min(rate, merged)
        slowdown = 100.0 * (1.0 - statistics.median(spine) / statistics.median(direct))
        overheads.append(slowdown)
        rates.append(rate)
        print(
            f"{name}: direct {statistics.median(direct):.1f} rollouts/s, through reinforge "
            f"{statistics.median(spine):.1f} rollouts/s, medians of {rounds} round{'s' * (rounds > 1)} "
            f"(slowdown {slowdown:.1f}%; the rounds: direct {_rates(direct)}, spine {_rates(spine)}), "
            f"merge rate {rate:.3f}",
            flush=True,
        )
    return overheads, rates


def _rates(values: list[float]) -> str:
    return " ".join(f"{v:.1f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="fewer rollouts (a smoke run)")
    parser.add_argument("--rollouts", type=int, help="rollouts per side (default 400; quick 40)")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating direct/spine runs per framework (default 3)"
    )
    parser.add_argument("--only", nargs="*", choices=sorted(FRAMEWORKS), help="these frameworks alone")
    args = parser.parse_args()
    n = args.rollouts or (40 if args.quick else 400)
    rounds = 1 if args.quick else args.rounds
    if rounds < 1:
        parser.error("--rounds must be at least 1")

    port = free_port()
    upstream_url = f"http://127.0.0.1:{port}"
    upstream = subprocess.Popen([sys.executable, str(BASELINES / "tool_loop_upstream.py"), str(port)])
    try:
        wait_http(upstream_url + "/health", proc=upstream)
        print(
            f"frameworks_bench: {n} rollouts per side and round, {rounds} rounds, at concurrency "
            f"{args.concurrency}",
            flush=True,
        )
        # One event loop for everything: frameworks cache HTTP clients across agents (LangChain's
        # ChatOpenAI shares one per process), which must not outlive the loop they were made on.
        overheads, rates = asyncio.run(
            bench(args.only or list(FRAMEWORKS), upstream_url, n, args.concurrency, rounds)
        )
    finally:
        upstream.terminate()
        upstream.wait(10)
    if overheads:
        print(f"RESULT framework_overhead_max_pct={max(overheads):.1f}")
        print(f"RESULT framework_merge_rate_min={min(rates):.3f}")


if __name__ == "__main__":
    main()
