"""The API formats the gateway speaks, one adapter each (see `formats.base.ApiFormat`)."""

from reinforge.gateway.formats.anthropic_messages import AnthropicMessages
from reinforge.gateway.formats.base import ApiFormat, FormatContext, TokenTexts
from reinforge.gateway.formats.chat_completions import ChatCompletions
from reinforge.gateway.formats.completions import Completions
from reinforge.gateway.formats.responses import Responses

API_FORMATS: tuple[type[ApiFormat], ...] = (ChatCompletions, Completions, Responses, AnthropicMessages)
"""Served under every agent base URL, in this order."""

__all__ = ["API_FORMATS", "ApiFormat", "FormatContext", "TokenTexts"]
