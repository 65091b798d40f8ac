"""The OpenAI-compatible gateway: per-attempt URLs, exact token ids and logprobs, recorded as spans.

app = create_gateway_app(store, backend, secret)      # serve it, or mount it beside the store
# agent side: base_url=<gateway>/r/<attempt_id>/v1, api_key=attempt_token(secret, attempt_id)
"""

from reinforge.gateway.app import create_gateway_app
from reinforge.gateway.auth import attempt_token, finish_token
from reinforge.gateway.backend import (
    Backend,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    TextDelta,
    ToolCall,
)
from reinforge.gateway.errors import UpstreamError
from reinforge.gateway.recorder import SpanRecorder
from reinforge.gateway.scripted import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.gateway.service import DEFAULT_MAX_BODY_BYTES, Gateway
from reinforge.gateway.tool_calls import parse_tool_calls
from reinforge.gateway.upstream import UpstreamBackend

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "Backend",
    "Gateway",
    "GenerationRequest",
    "GenerationResult",
    "SamplingParams",
    "ScriptedBackend",
    "ScriptedReply",
    "ScriptedToolCall",
    "SpanRecorder",
    "TextDelta",
    "ToolCall",
    "UpstreamBackend",
    "UpstreamError",
    "attempt_token",
    "create_gateway_app",
    "finish_token",
    "parse_tool_calls",
]
