"""Chat prompts as token ids, with the policy's own turns kept as the tokens it generated.

Why: a chat template spells an assistant turn its own way. When the model wrote a tool call with
other spacing or key order than the template's (a sampled completion can), rendering the
conversation again puts tokens into the next prompt that the model never wrote: the prompt no
longer extends the previous call's prompt and completion, credit/ cannot merge the two calls, and
training sees a history off the model's own distribution. So each turn the policy generated
(`GenerationRequest.generated_turns`) is cut out of the rendered text and its generated ids go in
its place. Where the template already spells every such turn as generated (the usual case), the
prompt is the plain rendering.

A template that renders no tools (SmolLM2's ChatML) gets the tools, tool calls and tool results
written into the messages in one default form (`inference.tool_prompt`), so every backend that
renders through here serves tools the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from reinforge.errors import InvalidRequestError
from reinforge.inference.tool_prompt import has_tool_content, template_renders_tools, tools_as_text

if TYPE_CHECKING:  # transformers is imported by whoever holds a tokenizer, not by the gateway's imports
    from transformers import PreTrainedTokenizerBase


class ChatRenderer:
    """Renders chat requests with a tokenizer's chat template into prompt ids."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, stop_ids: Iterable[int] = ()) -> None:
        self.tokenizer = tokenizer
        eos = tokenizer.eos_token_id
        self.stop_ids = {*stop_ids, *([eos] if isinstance(eos, int) else [])}
        """Tokens a generated turn ends on that the template writes too: where a kept turn ends."""
        self._renders_tools: bool | None = None

    @property
    def renders_tools(self) -> bool:
        """Whether the chat template renders tools itself (probed once); if not, `render` writes
        them into the messages in the default form."""
        if self._renders_tools is None:
            self._renders_tools = template_renders_tools(self.tokenizer)
        return self._renders_tools

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        generated: dict[int, list[int]] | None = None,
    ) -> list[int]:
        """The prompt ids of `messages` with `tools` and the generation prompt; `generated` turns
        (index in `messages` -> the ids the model generated) as those ids."""
        if not messages:
            raise InvalidRequestError("messages must not be empty")
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise InvalidRequestError(f"messages[{i}] needs a string 'role'")
        template_tools: list[Any] | None = list(tools) if tools else None
        if has_tool_content(messages, tools) and not self.renders_tools:
            messages, generated = tools_as_text(messages, tools, generated)
            template_tools = None
        try:
            text = self._template(messages, template_tools, generation_prompt=True)
        except Exception as exc:  # jinja raises many types; all mean the messages don't fit the template
            raise InvalidRequestError(
                f"the messages cannot be rendered with the chat template: {exc}"
            ) from exc
        ids = self._tokenize(text)
        if not generated or contains_in_order(ids, [generated[k] for k in sorted(generated)]):
            return ids
        return self._spliced(messages, template_tools, text, generated) or ids

    def _template(
        self, messages: list[dict[str, Any]], tools: list[Any] | None, generation_prompt: bool
    ) -> str:
        return str(
            self.tokenizer.apply_chat_template(
                messages, tools=tools, tokenize=False, add_generation_prompt=generation_prompt
            )
        )

    def _tokenize(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"]) if text else []

    def _spliced(
        self,
        messages: list[dict[str, Any]],
        tools: list[Any] | None,
        text: str,
        generated: dict[int, list[int]],
    ) -> list[int] | None:
        """`text` with each generated turn, up to and including the stop token it ended on, as its
        ids; None where the template's text can't be cut into turns.

        A turn's text is what rendering its message adds to the conversation before it: from the
        prompt it was generated from to the same conversation with the turn rendered. A turn that did
        not end on a stop token (cut by max_tokens) stays as the template spells it.
        """
        ids: list[int] = []
        done = 0  # characters of `text` already in `ids`
        for index in sorted(generated):
            turn = generated[index]
            if not 0 < index < len(messages) or messages[index].get("role") != "assistant" or not turn:
                return None
            if turn[-1] not in self.stop_ids:
                continue
            try:
                before = self._template(messages[:index], tools, generation_prompt=True)
                through = self._template(messages[: index + 1], tools, generation_prompt=False)
            except Exception:  # a template that renders only whole conversations
                return None
            if not (text.startswith(through) and through.startswith(before) and len(before) >= done):
                return None
            stop = str(self.tokenizer.decode(turn[-1:], skip_special_tokens=False))
            end = through.rfind(stop, len(before)) if stop else -1
            if end < 0:
                continue
            ids += self._tokenize(text[done : len(before)]) + turn
            done = end + len(stop)
        return ids + self._tokenize(text[done:])


def contains_in_order(ids: list[int], parts: list[list[int]]) -> bool:
    """Whether each of `parts` occurs in `ids` as a contiguous run, in order and without overlap."""
    start = 0
    for part in parts:
        if not part:
            continue
        first, width = part[0], len(part)
        while True:
            try:
                at = ids.index(first, start)
            except ValueError:
                return False
            if ids[at : at + width] == part:
                start = at + width
                break
            start = at + 1
    return True
