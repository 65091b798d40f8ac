"""Tiny causal LMs and their tokenizer, built locally: the embedded default policy needs no hub."""

from reinforge.models.chat_template import CHAT_TEMPLATE, TOOL_CALL_END, TOOL_CALL_START
from reinforge.models.factory import tiny_llama, tiny_qwen2
from reinforge.models.tokenizer import build_tokenizer

__all__ = ["CHAT_TEMPLATE", "TOOL_CALL_END", "TOOL_CALL_START", "build_tokenizer", "tiny_llama", "tiny_qwen2"]
