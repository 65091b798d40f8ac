"""A backend that answers with scripted replies, encoded by a real tokenizer.

Why: gateway, runner and credit tests need real token ids and logprobs (the exact ids a chat
template and a BPE produce) without running a model. The ids are what the tokenizer gives for the
reply, rendered the way the tiny models write it (text, then `<tool_call>{...}</tool_call>` per call,
then EOS); the logprobs are deterministic per reply so tests can assert on them.
"""

from __future__ import annotations

import asyncio
import json
import random
import secrets
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from reinforge.errors import InvalidRequestError, PromptTooLongError
from reinforge.inference.chat_render import ChatRenderer
from reinforge.inference.contract import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    ToolCall,
)
from reinforge.inference.tool_prompt import text_of

TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"


class ScriptedToolCall(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    arguments: dict[str, Any] | str = Field(default_factory=dict)


class ScriptedReply(BaseModel):
    """One reply: text and/or tool calls. `malformed` writes an unparsable tool call instead."""

    model_config = ConfigDict(extra="forbid")

    text: str = ""
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    malformed: bool = False


Reply = str | ScriptedReply | dict[str, Any]


def turns_since_question(request: GenerationRequest) -> tuple[str, int]:
    """The task's question (the request's last user turn: earlier ones are demonstrations) and how
    many assistant turns the agent has had since: where a scripted policy (`reinforge sft`'s warm
    starts) is in the conversation it planned for that question."""
    messages = request.messages or []
    users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
    if not users:
        raise InvalidRequestError("a scripted policy needs a user turn to answer")
    done = sum(1 for m in messages[users[-1] + 1 :] if m.get("role") == "assistant")
    return text_of(messages[users[-1]].get("content")), done


class _Tokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> Any: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = ...) -> str: ...


class ScriptedBackend:
    """Replies in order (cycling), or from `replies(request)` when given a function.

    `tokenizer` is a `transformers` tokenizer (its chat template renders chat prompts, through
    `ChatRenderer` like the embedded engine's) or a raw
    `tokenizers.Tokenizer` (chat prompts are rendered as `<|role|>content</s>`). Set `policy_version`
    to simulate a weight update; `delay_s` holds each generation that long (for pause/drain tests).
    `compact_json` writes tool calls without spaces, as reinforge's chat template renders them: traces
    recorded for a warm start then teach the model the very tokens its own history will show.
    `max_seq_len` refuses a prompt that leaves no room to generate, as the engine does.
    """

    def __init__(
        self,
        tokenizer: Any,
        replies: Sequence[Reply] | Callable[[GenerationRequest], Reply],
        *,
        model_name: str = "reinforge-scripted",
        policy_version: int = 0,
        delay_s: float = 0.0,
        compact_json: bool = False,
        max_seq_len: int | None = None,
    ) -> None:
        if not callable(replies) and not replies:
            raise InvalidRequestError("ScriptedBackend needs at least one reply")
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.policy_version = policy_version
        self.delay_s = delay_s
        self.max_seq_len = max_seq_len
        self._replies = replies
        self._separators = (",", ":") if compact_json else (", ", ": ")
        self._next = 0
        self._renderer = (
            ChatRenderer(tokenizer)
            if hasattr(tokenizer, "apply_chat_template") and getattr(tokenizer, "chat_template", None)
            else None
        )
        """Renders chat prompts as the engine does: the policy's own turns kept as their ids, tools
        in the default form where the template renders none."""
        eos = getattr(tokenizer, "eos_token_id", None)
        self._eos: int | None = eos if isinstance(eos, int) else None
        self.requests: list[GenerationRequest] = []
        """Every request received, in order (tests assert on what the gateway passed through)."""

    # -- tokenizer adapters -----------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        encoded = self.tokenizer.encode(text, add_special_tokens=False)
        return list(encoded.ids) if hasattr(encoded, "ids") else list(encoded)

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=False))

    def token_texts(self, ids: list[int]) -> list[str]:
        """The text of each token, for the `token` fields of OpenAI logprobs."""
        return [self.decode([i]) for i in ids]

    def prompt_ids(self, request: GenerationRequest) -> list[int]:
        if request.prompt is not None:
            return list(request.prompt) if isinstance(request.prompt, list) else self.encode(request.prompt)
        messages = request.messages or []
        if self._renderer is not None and messages:
            return self._renderer.render(messages, request.tools, request.generated_turns)
        text = "".join(f"<|{m['role']}|>{m.get('content') or ''}</s>" for m in messages) + "<|assistant|>"
        return self.encode(text)

    # -- generation -------------------------------------------------------------------------------

    def _reply(self, request: GenerationRequest) -> ScriptedReply:
        if callable(self._replies):
            raw = self._replies(request)
        else:
            raw = self._replies[self._next % len(self._replies)]
            self._next += 1
        if isinstance(raw, ScriptedReply):
            return raw
        if isinstance(raw, str):
            return ScriptedReply(text=raw)
        return ScriptedReply.model_validate(raw)

    def _build(self, request: GenerationRequest) -> tuple[GenerationResult, list[int]]:
        """The result, and the ids of its plain-text part (what a stream shows as deltas)."""
        self.requests.append(request)
        prompt_ids = self.prompt_ids(request)
        if self.max_seq_len is not None and len(prompt_ids) >= self.max_seq_len:
            raise PromptTooLongError(len(prompt_ids), self.max_seq_len)
        reply = self._reply(request)
        text = reply.text
        stop_hit = False
        for stop in request.sampling.stop:
            at = text.find(stop)
            if at >= 0:
                text, stop_hit = text[:at], True
        calls = [] if stop_hit else reply.tool_calls
        markup = ""
        tool_calls: list[ToolCall] = []
        for call in calls:
            arguments = (
                call.arguments
                if isinstance(call.arguments, str)
                else json.dumps(call.arguments, separators=self._separators)
            )
            comma, colon = self._separators
            payload = f'{{"name"{colon}{json.dumps(call.name)}{comma}"arguments"{colon}{arguments}}}'
            markup += TOOL_CALL_START + payload + TOOL_CALL_END
            tool_calls.append(
                ToolCall(id="call_" + secrets.token_hex(8), name=call.name, arguments=arguments)
            )
        malformed = reply.malformed and not stop_hit
        if malformed:
            markup += f'{TOOL_CALL_START}{{"name": "broken", "arguments": {{{TOOL_CALL_END}'
        text_ids = self.encode(text) if text else []
        ids = text_ids + (self.encode(markup) if markup else [])
        finish: FinishReason = "tool_calls" if tool_calls else "stop"
        if self._eos is not None and not stop_hit:
            ids.append(self._eos)
        limit = request.sampling.max_tokens
        if limit is not None and len(ids) > limit:
            ids, text_ids = ids[:limit], text_ids[:limit]
            text, tool_calls, malformed, finish = self.decode(ids), [], False, "length"
        elif malformed:
            text += self.decode(self.encode(markup))
        rng = random.Random(hash((tuple(prompt_ids), tuple(ids))))
        logprobs = [round(-rng.uniform(0.001, 2.0), 6) for _ in ids]
        result = GenerationResult(
            text=text,
            prompt_token_ids=prompt_ids,
            completion_token_ids=ids,
            logprobs=logprobs,
            finish_reason=finish,
            tool_calls=tool_calls,
            malformed_tool_call=malformed,
            policy_version=self.policy_version,
        )
        return result, text_ids

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self._build(request)[0]

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        result, text_ids = self._build(request)
        sent = ""
        for n in range(1, len(text_ids) + 1):
            if self.delay_s:
                await asyncio.sleep(self.delay_s / max(len(text_ids), 1))
            so_far = self.decode(text_ids[:n])
            # A multi-byte character split across tokens decodes to U+FFFD until complete; wait for it.
            if so_far.endswith("\ufffd") or not so_far.startswith(sent):
                continue
            if len(so_far) > len(sent):
                yield TextDelta(text=so_far[len(sent) :])
                sent = so_far
        if self.delay_s and not text_ids:
            await asyncio.sleep(self.delay_s)
        yield result
