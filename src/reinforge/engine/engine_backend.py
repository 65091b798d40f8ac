"""`EngineBackend`: the gateway's Backend protocol served by the embedded engine.

It renders chat requests with the tokenizer's chat template (tools included), generates with the
engine, and turns `<tool_call>` blocks into OpenAI tool calls. The token ids and logprobs it returns
are exactly the engine's: the gateway records them and the trainer trains on them.
The policy's own earlier turns go into a prompt as the ids it generated (`inference.chat_render`).
"""

from __future__ import annotations

import contextlib
import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from transformers import PreTrainedTokenizerBase

from reinforge.engine.engine import Engine, EngineOutput
from reinforge.engine.process import EngineProcess
from reinforge.errors import InvalidRequestError
from reinforge.inference.chat_render import ChatRenderer
from reinforge.inference.contract import GenerationRequest, GenerationResult, TextDelta, token_id_texts
from reinforge.inference.structured import request_grammar
from reinforge.inference.tool_calls import parse_tool_calls, safe_prefix_len

TURN_MARKERS = (
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|tool|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|eot_id|>",
)
"""Tokens that start or end a turn: a chat completion stops there (the model would be writing
someone else's message). Only those in the tokenizer's vocabulary are used."""


RENDER_CACHE_SIZE = 4096
"""Rendered chat prompts kept: a group's rollouts, and every conversation's next call, send the same
messages again, and rendering (jinja + tokenizer) is most of what the gateway's thread does per call."""


class EngineBackend:
    """Backend for the gateway on top of an `Engine` (started on first use)."""

    def __init__(
        self,
        engine: Engine | EngineProcess,
        tokenizer: PreTrainedTokenizerBase | None = None,
        model_name: str = "reinforge-policy",
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer or engine.tokenizer
        self.model_name = model_name
        vocab = self.tokenizer.get_vocab()
        self._turn_stop_ids = sorted({vocab[m] for m in TURN_MARKERS if m in vocab})
        self._renderer = ChatRenderer(self.tokenizer, self._turn_stop_ids)
        self._rendered: OrderedDict[str, tuple[int, ...]] = OrderedDict()

    def _prepare(self, request: GenerationRequest) -> tuple[list[int], GenerationRequest, bool]:
        """Prompt ids, the request with chat stop ids and its output grammar added, and whether to
        parse tool calls."""
        use_tools = bool(request.tools) and request.tool_choice != "none"
        grammar = request_grammar(request) if request.messages is not None else None
        if request.messages is not None:
            if request.prompt is not None:
                raise InvalidRequestError("give either messages or prompt, not both")
            prompt_ids = self._render_chat(
                request.messages, request.tools if use_tools else None, request.generated_turns
            )
            sampling = request.sampling.model_copy(
                update={
                    "stop_token_ids": sorted({*request.sampling.stop_token_ids, *self._turn_stop_ids}),
                    "grammar": grammar if grammar is not None else request.sampling.grammar,
                }
            )
            request = request.model_copy(update={"sampling": sampling})
        elif isinstance(request.prompt, str):
            prompt_ids = list(self.tokenizer(request.prompt)["input_ids"])
        elif isinstance(request.prompt, list):
            prompt_ids = list(request.prompt)
        else:
            raise InvalidRequestError("the request needs messages or a prompt")
        return prompt_ids, request, use_tools and request.messages is not None

    def prepare_ahead(self, request: GenerationRequest) -> None:
        """Render a chat request's prompt into the render cache (`PreparesAhead`): a held call's
        prompt is rendered while it waits, not after the release with the step's other calls."""
        if request.messages is None or request.prompt is not None:
            return
        use_tools = bool(request.tools) and request.tool_choice != "none"
        with contextlib.suppress(InvalidRequestError):  # raised again by generate, as without this
            self._render_chat(request.messages, request.tools if use_tools else None, request.generated_turns)

    def _render_chat(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        generated: dict[int, list[int]] | None = None,
    ) -> list[int]:
        """The prompt ids of `messages` with `tools`, rendered by the chat template with `generated`
        turns kept as their token ids (cached by value)."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequestError(
                "this model's tokenizer has no chat template (a base model, such as the packaged "
                "gemma3-270m), so chat messages cannot be rendered: send a prompt (text or token ids) "
                "instead, or set tokenizer.chat_template"
            )
        try:
            key: str | None = json.dumps([messages, tools, generated or None], ensure_ascii=False)
        except (TypeError, ValueError):  # not JSON (a caller's own objects): render without the cache
            key = None
        if key is not None and (hit := self._rendered.get(key)) is not None:
            self._rendered.move_to_end(key)
            return list(hit)
        ids = self._renderer.render(messages, tools, generated)
        if key is not None:
            self._rendered[key] = tuple(ids)
            if len(self._rendered) > RENDER_CACHE_SIZE:
                self._rendered.popitem(last=False)
        return ids

    def _result(self, prompt_ids: list[int], out: EngineOutput, parse_tools: bool) -> GenerationResult:
        parsed = parse_tool_calls(out.text) if parse_tools else None
        tool_calls = parsed.tool_calls if parsed else []
        return GenerationResult(
            text=parsed.text if parsed else out.text,
            prompt_token_ids=prompt_ids,
            completion_token_ids=out.token_ids,
            logprobs=out.logprobs,
            finish_reason="tool_calls" if tool_calls else out.finish_reason,
            tool_calls=tool_calls,
            malformed_tool_call=bool(parsed and parsed.malformed),
            policy_version=out.policy_version,
        )

    def token_texts(self, ids: list[int]) -> list[str]:
        """Token ids, not texts: decoding each token would be per-call work for a field trainers
        read as ids anyway."""
        return token_id_texts(ids)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        prompt_ids, request, parse_tools = self._prepare(request)
        out = await self.engine.generate(prompt_ids, request.sampling, adapter=request.adapter)
        return self._result(prompt_ids, out, parse_tools)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        """Text deltas (tool-call markup held back), then the result; the deltas join to its text."""
        prompt_ids, request, parse_tools = self._prepare(request)
        text, sent = "", 0
        async for item in self.engine.stream(prompt_ids, request.sampling, adapter=request.adapter):
            if isinstance(item, EngineOutput):
                result = self._result(prompt_ids, item, parse_tools)
                if result.text.startswith(text[:sent]) and len(result.text) > sent:
                    yield TextDelta(text=result.text[sent:])
                yield result
                return
            text += item.text
            ready = safe_prefix_len(text) if parse_tools else len(text)
            if ready > sent:
                yield TextDelta(text=text[sent:ready])
                sent = ready
