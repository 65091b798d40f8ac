"""Span names and attribute keys that reinforge writes and reads (its semantic conventions).

The gateway writes LLM spans, the tracing API writes reward/tool/custom spans, and credit/ reads them
back; they meet only here.
"""

from __future__ import annotations

import hashlib

# Span names
SPAN_LLM_CALL = "reinforge.llm_call"
"""One LLM call recorded by the gateway."""
SPAN_REWARD = "reinforge.reward"
"""A reward emitted during the run (emit_reward or a POST to the reward URL)."""
SPAN_FINAL_REWARD = "reinforge.final_reward"
"""The attempt's final reward (the agent's return value, or the last REINFORGE_REWARD line)."""
SPAN_TOOL_RESULT = "reinforge.tool_result"
"""A tool result the agent sent back to the gateway marked as failed (Anthropic's `is_error`)."""

# What kind of step a span is: "llm", "tool", "reward", "custom"
ATTR_STEP_KIND = "reinforge.step.kind"
STEP_LLM = "llm"
STEP_TOOL = "tool"
STEP_REWARD = "reward"
STEP_CUSTOM = "custom"

ATTR_AGENT_NAME = "reinforge.agent.name"
"""Which agent/component made the call (for selective training in multi-agent systems)."""

# LLM call attributes (written by the gateway)
ATTR_LLM_REQUEST = "reinforge.llm.request"
"""The request body as the client sent it (a JSON object)."""
ATTR_LLM_RESPONSE = "reinforge.llm.response"
"""The response body returned to the client (a JSON object; for streams, the assembled response)."""
ATTR_LLM_ENDPOINT = "reinforge.llm.endpoint"
"""'chat.completions', 'completions' or 'responses'."""
ATTR_PROMPT_TOKEN_IDS = "reinforge.llm.prompt_token_ids"
ATTR_COMPLETION_TOKEN_IDS = "reinforge.llm.completion_token_ids"
ATTR_COMPLETION_LOGPROBS = "reinforge.llm.completion_logprobs"
"""The behaviour logprob of each completion token, as the engine computed it."""
ATTR_POLICY_VERSION = "reinforge.llm.policy_version"
ATTR_FINISH_REASON = "reinforge.llm.finish_reason"
ATTR_MODEL = "reinforge.llm.model"
ATTR_LATENCY_MS = "reinforge.llm.latency_ms"
ATTR_MALFORMED_TOOL_CALL = "reinforge.llm.malformed_tool_call"
"""True when the model tried to call a tool but the call could not be parsed (an AIR signal)."""
ATTR_HISTORY_MATCHED = "reinforge.llm.history.matched"
"""Assistant turns of the request's history that the gateway itself produced for this attempt."""
ATTR_HISTORY_RESPELLED = "reinforge.llm.history.respelled"
"""Of those, turns the agent sent back in another spelling (rendered as generated instead)."""
ATTR_HISTORY_UNMATCHED = "reinforge.llm.history.unmatched"
"""Assistant turns the gateway did not produce, or that the agent changed: rendered as sent."""
ATTR_SAMPLING_ASKED = "reinforge.llm.sampling.asked"
"""The sampling the call asked for: {temperature, top_p, top_k, max_tokens} as parsed from its body."""
ATTR_SAMPLING_APPLIED = "reinforge.llm.sampling.applied"
"""The sampling the backend was given: the run's for the phase when the run owns sampling."""
ATTR_SAMPLING_OWNER = "reinforge.llm.sampling.owner"
"""Who decided the applied sampling: 'run' (the run's resources) or 'agent' (the call's own)."""
ATTR_SEQUENCE_IN_ATTEMPT = "reinforge.sequence"
"""A per-attempt counter stamped by the writer, so order survives equal timestamps."""

# Rewards
ATTR_REWARD_VALUE = "reinforge.reward.value"
ATTR_REWARD_NAME = "reinforge.reward.name"

# Tools and system signals (Automatic Intermediate Rewards)
ATTR_TOOL_NAME = "reinforge.tool.name"
ATTR_TOOL_CALL_ID = "reinforge.tool.call_id"
ATTR_AIR_SIGNAL = "reinforge.air.signal"
"""A system signal on a span: one of AIR_* below."""
AIR_TOOL_ERROR = "tool_error"
AIR_MALFORMED_TOOL_CALL = "malformed_tool_call"
AIR_TIMEOUT = "timeout"


def trace_id_for(attempt_id: str) -> str:
    """One trace per attempt; attempt ids from `new_id()` already have a trace id's shape."""
    lowered = attempt_id.lower()
    if len(lowered) == 32 and all(c in "0123456789abcdef" for c in lowered):
        return lowered
    return hashlib.blake2b(attempt_id.encode(), digest_size=16).hexdigest()


# Steps recorded from agent frameworks' own telemetry (no agent code change)
STEP_AGENT = "agent"
"""An agent/role/node run (a LangGraph node, an Agents SDK or AutoGen agent); it carries
ATTR_AGENT_NAME, and credit names the LLM calls made inside it after it."""
ATTR_FRAMEWORK = "reinforge.framework"
"""Which framework's telemetry a step came from: 'langchain', 'openai_agents' or 'otel_genai'."""
