"""Token-faithful history: an assistant turn the gateway produced is rendered as it was generated.

Why: agent frameworks send the conversation back in their own serialisation. LangChain re-dumps a
tool call's arguments (`{"expression":"1*3"}` returns as `{"expression": "1*3"}`), others turn an
empty content into `null` or reorder keys. Rendered as sent, the next prompt holds text the model
never wrote: credit/ can no longer merge the conversation along its tokens, and the model learns from
prompts off its own distribution. So the gateway remembers, per attempt, every assistant turn it
answered (its text and tool calls exactly as generated), finds them again in later requests (by
tool-call id, else by text), and puts the generated spelling back before the prompt is rendered.
It also hands the backend each restored turn's generated token ids: a chat template may spell a
tool call its own way however the message is spelt, and a backend that renders prompts itself uses
the ids to keep the prompt on the model's own tokens (`GenerationRequest.generated_turns`).

A turn is restored only when what came back means the same (the same tool names and JSON-equal
arguments, or the same text up to surrounding whitespace); anything else renders as sent and is
counted, so an agent that edits its history is never overruled silently. Arguments that differ only
by keys the tool's schema declares with their default value (Claude Code sends its Edit calls back
with `"replace_all": false` added) mean the same: the call the model wrote is what it did.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from reinforge.inference.contract import GenerationResult, ToolCall

MAX_TURNS_PER_ATTEMPT = 512
"""Turns remembered per attempt; an agent loop longer than this renders its oldest turns as sent."""


@dataclass(frozen=True, slots=True)
class Turn:
    """One assistant turn as the backend produced it."""

    text: str
    tool_calls: tuple[ToolCall, ...]
    token_ids: tuple[int, ...] = ()
    """The completion's token ids, exactly as generated."""

    def message(self, sent: dict[str, Any]) -> dict[str, Any]:
        """The turn as a chat message in its generated spelling (other keys of `sent` kept)."""
        restored = {k: v for k, v in sent.items() if k not in ("content", "tool_calls")}
        restored["content"] = self.text
        if self.tool_calls:
            restored["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return restored


@dataclass(frozen=True, slots=True)
class Restored:
    """What `TurnMemory.restore` did to one request's history."""

    messages: list[dict[str, Any]]
    matched: int = 0
    """Assistant turns found among the attempt's own answers."""
    respelled: int = 0
    """Of those, turns whose spelling differed from what was generated (and were put back)."""
    unmatched: int = 0
    """Assistant turns the gateway did not produce (or that were changed): rendered as sent."""
    token_ids: dict[int, list[int]] = field(default_factory=dict)
    """Index in `messages` -> the generated token ids of each restored turn."""


def _json_equal(a: str, b: Any) -> bool:
    try:
        return bool(json.loads(a) == (json.loads(b) if isinstance(b, str) else b))
    except (TypeError, ValueError):
        return False


def _with_defaults(made: str, sent: Any, defaults: dict[str, Any]) -> bool:
    """Whether `sent` is `made` with some keys added at the tool's declared default values."""
    try:
        generated = json.loads(made)
        echoed = json.loads(sent) if isinstance(sent, str) else sent
    except (TypeError, ValueError):
        return False
    if not isinstance(generated, dict) or not isinstance(echoed, dict):
        return False
    added = echoed.keys() - generated.keys()
    return (
        generated.keys() <= echoed.keys()
        and all(echoed[k] == v for k, v in generated.items())
        and all(k in defaults and echoed[k] == defaults[k] for k in added)
    )


def schema_defaults(tools: list[dict[str, Any]] | None) -> dict[str, dict[str, Any]]:
    """Tool name -> the default value of each top-level argument its schema gives one."""
    out: dict[str, dict[str, Any]] = {}
    for tool in tools or []:
        function = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            continue
        properties = (function.get("parameters") or {}).get("properties")
        if isinstance(properties, dict):
            found = {k: v["default"] for k, v in properties.items() if isinstance(v, dict) and "default" in v}
            if found:
                out[function["name"]] = found
    return out


def _text(content: Any) -> str | None:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _spelling(message: dict[str, Any]) -> tuple[str | None, list[tuple[Any, Any]]]:
    """What of an assistant message a chat template renders: its text and its calls' names and
    argument strings (not the keys around them, nor `null` against an empty string)."""
    calls = [c.get("function") or {} for c in message.get("tool_calls") or [] if isinstance(c, dict)]
    return _text(message.get("content")), [(fn.get("name"), fn.get("arguments")) for fn in calls]


@dataclass
class TurnMemory:
    """The assistant turns one attempt was answered with."""

    by_call_id: dict[str, Turn] = field(default_factory=dict)
    by_text: dict[str, Turn] = field(default_factory=dict)
    turns: int = 0

    def remember(self, result: GenerationResult) -> None:
        if self.turns >= MAX_TURNS_PER_ATTEMPT:
            return
        turn = Turn(result.text, tuple(result.tool_calls), tuple(result.completion_token_ids))
        self.turns += 1
        if turn.tool_calls:
            for call in turn.tool_calls:
                self.by_call_id[call.id] = turn
        else:
            self.by_text.setdefault(turn.text.strip(), turn)

    def _find(self, message: dict[str, Any], defaults: dict[str, dict[str, Any]]) -> Turn | None:
        calls = message.get("tool_calls") or []
        text = _text(message.get("content"))
        if text is None:
            return None
        if not calls:
            return self.by_text.get(text.strip())  # keyed by the stripped text: same up to whitespace
        ids = [c.get("id") for c in calls if isinstance(c, dict)]
        turn = self.by_call_id.get(ids[0]) if ids and isinstance(ids[0], str) else None
        if turn is None or len(calls) != len(turn.tool_calls) or text.strip() != turn.text.strip():
            return None
        for sent, made in zip(calls, turn.tool_calls, strict=True):
            fn = sent.get("function") or {}
            if sent.get("id") != made.id or fn.get("name") != made.name:
                return None
            sent_arguments = fn.get("arguments")
            if (
                sent_arguments != made.arguments
                and not _json_equal(made.arguments, sent_arguments)
                and not _with_defaults(made.arguments, sent_arguments, defaults.get(made.name, {}))
            ):
                return None
        return turn

    def restore(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> Restored:
        """`messages` with each assistant turn of this attempt's own in its generated spelling
        (`tools`: the request's function tools, whose schema defaults an echoed call may add)."""
        if not self.turns:
            assistant = sum(1 for m in messages if m.get("role") == "assistant")
            return Restored(messages, unmatched=assistant)
        defaults = schema_defaults(tools)
        out: list[dict[str, Any]] = []
        token_ids: dict[int, list[int]] = {}
        matched = respelled = unmatched = 0
        for message in messages:
            if message.get("role") != "assistant":
                out.append(message)
                continue
            turn = self._find(message, defaults)
            if turn is None:
                unmatched += 1
                out.append(message)
                continue
            matched += 1
            restored = turn.message(message)
            if _spelling(message) != _spelling(restored):
                respelled += 1
            if turn.token_ids:
                token_ids[len(out)] = list(turn.token_ids)
            out.append(restored)
        if not matched:
            return Restored(messages, unmatched=unmatched)  # unchanged: the caller may keep its request
        return Restored(out, matched, respelled, unmatched, token_ids)
