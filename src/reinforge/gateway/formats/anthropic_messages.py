"""Anthropic's Messages API (`POST .../v1/messages`), plain and streamed, with server-held threads.

The shapes follow Anthropic's API reference so the official SDK parses them into its typed objects:
a `message` body, or the named events `message_start`, `content_block_start`/`_delta`/`_stop`,
`message_delta` (stop reason, usage) and `message_stop`.

Threads (the `message-threads` beta, which the SDK's `tool_runner` uses by default): a request with
`thread: {"type": "create"}` asks the gateway to hold the conversation under the id of its reply, and
`{"type": "continue", "previous_message_id": ...}` sends only the new turn. The gateway holds them per
attempt (in the attempt's memory, so they go when the attempt is forgotten), at most
`MAX_THREADS_PER_ATTEMPT` at a time.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Self

from reinforge.gateway.anthropic_bodies import (
    MessagesBody,
    ToolResultBlock,
    messages_request,
    parse_messages_body,
)
from reinforge.gateway.errors import GatewayHTTPError
from reinforge.gateway.formats.base import ApiFormat, Event, FormatContext
from reinforge.gateway.service import new_id
from reinforge.inference.contract import GenerationResult, ToolCall

MAX_THREADS_PER_ATTEMPT = 128
"""Threads one attempt may hold; the one continued longest ago gives way (the SDK then replays it)."""
_MAX_CONTINUED = 512
"""Replies remembered as already continued, to tell a second continue from an unknown id."""
_MEMORY_KEY = "anthropic.threads"


@dataclass(frozen=True, slots=True)
class HeldThread:
    """A conversation as the next turn extends it: chat messages (system prompt first, the reply
    that ends the thread last) and the tools the thread was created with."""

    messages: tuple[dict[str, Any], ...]
    tools: list[dict[str, Any]] | None


def _thread_error(status: int, message: str, code: str) -> GatewayHTTPError:
    return GatewayHTTPError(status, message, param="thread.previous_message_id", code=code)


class Threads:
    """One attempt's threads, by the id of the reply each one ends with.

    A reply is continued once (the SDK continues from the latest reply only): a second continue of it
    gets `thread_already_continued`, an id the attempt does not hold `thread_not_found`. On either the
    SDK replays the whole history under a new thread, so a thread pushed out by the bound costs one
    longer request, not a failed turn.
    """

    def __init__(self) -> None:
        self._held: OrderedDict[str, HeldThread] = OrderedDict()
        self._continued: OrderedDict[str, None] = OrderedDict()

    @classmethod
    def of(cls, memory: dict[str, object]) -> Threads:
        """The threads kept in an attempt's memory (made on first use)."""
        threads = memory.get(_MEMORY_KEY)
        if not isinstance(threads, Threads):
            threads = memory[_MEMORY_KEY] = Threads()
        return threads

    def get(self, message_id: str) -> HeldThread:
        held = self._held.get(message_id)
        if held is not None:
            return held
        if message_id in self._continued:
            raise _thread_error(
                400,
                f"thread.previous_message_id: {message_id!r} was already continued; "
                "continue from the thread's latest reply",
                "thread_already_continued",
            )
        raise _thread_error(
            404,
            f"thread.previous_message_id: no thread of this attempt ends with {message_id!r}; "
            'replay the conversation with thread {"type": "create"}',
            "thread_not_found",
        )

    def hold(self, message_id: str, thread: HeldThread, continues: str | None) -> None:
        """Hold `thread` under its reply's id; the reply it continues (if any) is done with."""
        if continues is not None and self._held.pop(continues, None) is not None:
            self._continued[continues] = None
            while len(self._continued) > _MAX_CONTINUED:
                self._continued.popitem(last=False)
        self._held[message_id] = thread
        while len(self._held) > MAX_THREADS_PER_ATTEMPT:
            self._held.popitem(last=False)

    def __len__(self) -> int:
        return len(self._held)


def tool_input(call: ToolCall) -> tuple[dict[str, Any], str]:
    """A tool call's input object and the JSON text that streams it (the model's own spelling, key
    order included; `{}` when the arguments are not a JSON object)."""
    try:
        value = json.loads(call.arguments)
    except ValueError:
        value = None
    return (value, call.arguments) if isinstance(value, dict) else ({}, "{}")


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call)[0]}


def _reply_message(result: GenerationResult) -> dict[str, Any]:
    """The reply as the chat message it becomes when the agent sends it back."""
    message: dict[str, Any] = {"role": "assistant", "content": result.text}
    if result.tool_calls:
        message["tool_calls"] = [c.as_openai() for c in result.tool_calls]
    return message


class AnthropicMessages(ApiFormat):
    path = "/messages"
    endpoint = "anthropic.messages"
    named_events = True

    def __init__(self, body: MessagesBody, context: FormatContext) -> None:
        self.context = context
        self.stream = body.stream
        self.stops = body.stop_sequences or []
        self.message_id = "msg_" + new_id()
        self._threads: Threads | None = None
        self._continues: str | None = None
        thread = body.thread
        if thread is None:
            self.request = messages_request(body)
        elif thread.type == "create":
            if thread.previous_message_id is not None:
                raise GatewayHTTPError(
                    400,
                    "thread.previous_message_id: only a continue names the reply it continues",
                    param="thread.previous_message_id",
                )
            self._threads = Threads.of(context.attempt_memory)
            self.request = messages_request(body)
        else:
            if not thread.previous_message_id:
                raise GatewayHTTPError(
                    400,
                    "thread.previous_message_id: a continue names the reply it continues",
                    param="thread.previous_message_id",
                )
            for name in ("system", "tools"):
                if name in body.model_fields_set:
                    raise GatewayHTTPError(
                        400,
                        f"{name}: a thread keeps the {name} it was created with; leave it out of a continue",
                        param=name,
                    )
            self._threads = Threads.of(context.attempt_memory)
            held = self._threads.get(thread.previous_message_id)
            self.request = messages_request(body, list(held.messages), held.tools)
            self._continues = thread.previous_message_id
        self.failed_tool_calls = tuple(
            block.tool_use_id
            for message in body.messages
            for block in message.content
            if isinstance(block, ToolResultBlock) and block.is_error
        )
        self._text_open = False
        self._blocks = 0

    @classmethod
    def parse(cls, data: dict[str, Any], context: FormatContext) -> Self:
        return cls(parse_messages_body(data), context)

    # -- the message ------------------------------------------------------------------------------------

    def _stop_sequence(self, result: GenerationResult) -> str | None:
        """The stop sequence that ended the generation, when the tokens show it.

        Backends cut a matched stop string from the text but keep its tokens (vLLM, the embedded
        engine), so it is the generated text past `result.text`; a backend whose tokens stop before the
        string shows nothing, and the reply reads as `end_turn`.
        """
        if result.finish_reason != "stop" or result.tool_calls or not self.stops:
            return None
        generated = "".join(self.context.texts(result.completion_token_ids))
        if not generated.startswith(result.text):
            return None
        tail = generated[len(result.text) :]
        return next((stop for stop in self.stops if tail.startswith(stop)), None)

    def _stop(self, result: GenerationResult) -> tuple[str, str | None]:
        if result.tool_calls:
            return "tool_use", None
        if result.finish_reason == "length":
            return "max_tokens", None
        stop = self._stop_sequence(result)
        return ("stop_sequence", stop) if stop is not None else ("end_turn", None)

    def _message(self, content: list[dict[str, Any]], usage: dict[str, int]) -> dict[str, Any]:
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.context.model,
            "content": content,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        }

    def _remember(self, result: GenerationResult) -> None:
        if self._threads is None:
            return
        messages = (*(self.request.messages or []), _reply_message(result))
        self._threads.hold(self.message_id, HeldThread(messages, self.request.tools), self._continues)

    def body(self, result: GenerationResult) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        if result.text or not result.tool_calls:
            content.append({"type": "text", "text": result.text})
        content += [_tool_use(call) for call in result.tool_calls]
        p, c = len(result.prompt_token_ids), len(result.completion_token_ids)
        message = self._message(content, {"input_tokens": p, "output_tokens": c})
        message["stop_reason"], message["stop_sequence"] = self._stop(result)
        self._remember(result)
        return message

    # -- streaming: named events, content blocks by index ------------------------------------------------

    def stream_start(self) -> list[Event]:
        usage = {"input_tokens": 0, "output_tokens": 0}
        return [{"type": "message_start", "message": self._message([], usage)}]

    def _open_text(self) -> Event:
        self._text_open = True
        self._blocks = 1
        return {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}

    def stream_text(self, text: str) -> list[Event]:
        events = [] if self._text_open else [self._open_text()]
        delta = {"type": "text_delta", "text": text}
        events.append({"type": "content_block_delta", "index": 0, "delta": delta})
        return events

    def stream_end(self, result: GenerationResult, rest: str) -> tuple[list[Event], dict[str, Any]]:
        events = self.stream_text(rest) if rest else []
        if not self._text_open and not result.tool_calls:
            events.append(self._open_text())  # an empty reply is one empty text block, as unstreamed
        if self._text_open:
            events.append({"type": "content_block_stop", "index": 0})
        for call in result.tool_calls:
            index, self._blocks = self._blocks, self._blocks + 1
            start = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": tool_input(call)[1]}
            events += [
                {"type": "content_block_start", "index": index, "content_block": start},
                {"type": "content_block_delta", "index": index, "delta": delta},
                {"type": "content_block_stop", "index": index},
            ]
        response = self.body(result)
        events.append(
            {
                "type": "message_delta",
                "delta": {"stop_reason": response["stop_reason"], "stop_sequence": response["stop_sequence"]},
                "usage": response["usage"],
            }
        )
        return events, response

    def stream_done(self, response: dict[str, Any]) -> list[Event]:
        return [{"type": "message_stop"}]
