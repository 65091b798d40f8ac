"""Runners: lease rollouts, run the user's agent (in process or as any command), report outcomes.

@reinforge.agent(name="solver")
def solve(task: dict, llm: reinforge.LLM) -> float: ...

await Runner(store, solve, gateway_url, gateway_secret, concurrency=8).run()
"""

from reinforge.net.keepalive_transport import KeepAliveTransport
from reinforge.net.openai_client import gateway_http_client
from reinforge.runner.agent import Agent, AgentFunction, FunctionAgent, agent, as_agent, load_agent
from reinforge.runner.command import REWARD_LINE_PREFIX, AgentProcessError, CommandAgent, CommandResult
from reinforge.runner.llm import LLM, attempt_url
from reinforge.runner.resources import model_from_resources
from reinforge.runner.runner import DEFAULT_MODEL, FlushError, Runner, RunnerStats

__all__ = [
    "DEFAULT_MODEL",
    "LLM",
    "REWARD_LINE_PREFIX",
    "Agent",
    "AgentFunction",
    "AgentProcessError",
    "CommandAgent",
    "CommandResult",
    "FlushError",
    "FunctionAgent",
    "KeepAliveTransport",
    "Runner",
    "RunnerStats",
    "agent",
    "as_agent",
    "attempt_url",
    "gateway_http_client",
    "load_agent",
    "model_from_resources",
]
