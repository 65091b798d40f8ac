"""The inference contract: what the gateway asks of whatever produces tokens, and the backends.

A backend turns one GenerationRequest into one generation and reports the exact token ids and
logprobs it produced. The embedded engine (`reinforge.engine.EngineBackend`), an upstream vLLM/SGLang
server (`UpstreamBackend`) and a scripted backend for tests (`ScriptedBackend`) all serve it; the
gateway depends on this package, never on a particular backend.
"""

from reinforge.inference.contract import (
    Backend,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    ToolCall,
)
from reinforge.inference.scripted import ScriptedBackend, ScriptedReply, ScriptedToolCall
from reinforge.inference.tool_calls import parse_tool_calls
from reinforge.inference.upstream import UpstreamBackend

__all__ = [
    "Backend",
    "FinishReason",
    "GenerationRequest",
    "GenerationResult",
    "ResponseFormat",
    "SamplingParams",
    "ScriptedBackend",
    "ScriptedReply",
    "ScriptedToolCall",
    "TextDelta",
    "ToolCall",
    "UpstreamBackend",
    "parse_tool_calls",
]
