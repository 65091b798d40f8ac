"""Hypothesis properties of the Hermes tool-call parser (`inference/tool_calls.py`) and of the tiny
models' chat template (`models/chat_template.py`), which must agree: what the template writes for an
assistant's tool calls is what the parser reads back."""

from __future__ import annotations

import functools
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reinforge.inference.tool_calls import TOOL_CALL_END, TOOL_CALL_START, parse_tool_calls, safe_prefix_len

PROPERTIES = settings(max_examples=100, deadline=None, derandomize=True, database=None)

plain = st.text(st.characters(blacklist_characters="<>"), max_size=40)
"""Text without markup (no '<' or '>': nothing that could open or close a marker)."""
names = st.text(
    st.characters(whitelist_categories=("L", "N"), whitelist_characters="_-."), min_size=1, max_size=20
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**9), 10**9) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=10,
)
arguments = st.dictionaries(st.text(max_size=10), json_values, max_size=4)
calls = st.lists(st.tuples(names, arguments), min_size=1, max_size=3)


def _block(name: str, args: dict[str, Any], *, compact: bool) -> str:
    separators = (",", ":") if compact else (", ", ": ")
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False, separators=separators)
    return TOOL_CALL_START + body + TOOL_CALL_END


@PROPERTIES
@given(text=st.text(max_size=200))
def test_any_text_parses_without_raising_and_malformed_text_is_returned_whole(text: str) -> None:
    parsed = parse_tool_calls(text)
    if parsed.malformed or not parsed.tool_calls:
        assert parsed.text == text and parsed.tool_calls == []
    else:
        assert TOOL_CALL_START not in parsed.text and TOOL_CALL_END not in parsed.text


@PROPERTIES
@given(prefix=plain, found=calls, compact=st.booleans())
def test_calls_round_trip_with_their_arguments_text_kept_exactly(
    prefix: str, found: list[tuple[str, dict[str, Any]]], compact: bool
) -> None:
    text = prefix + "".join(_block(name, args, compact=compact) for name, args in found)
    parsed = parse_tool_calls(text)
    assert not parsed.malformed
    assert parsed.text == prefix.rstrip()
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == found
    for call in parsed.tool_calls:
        assert call.arguments in text  # the model's own spelling, so the next prompt extends its tokens


@PROPERTIES
@given(prefix=plain, found=calls, garbage=st.sampled_from(["{", "[1]", '{"name": ""}', '{"arguments": 1}']))
def test_one_bad_block_makes_the_whole_completion_malformed_text(
    prefix: str, found: list[tuple[str, dict[str, Any]]], garbage: str
) -> None:
    good = "".join(_block(name, args, compact=True) for name, args in found)
    text = prefix + good + TOOL_CALL_START + garbage + TOOL_CALL_END
    parsed = parse_tool_calls(text)
    assert parsed.malformed and parsed.text == text and parsed.tool_calls == []
    unclosed = parse_tool_calls(prefix + good + TOOL_CALL_START + '{"name": "x"')
    assert unclosed.malformed and unclosed.tool_calls == []


@PROPERTIES
@given(prefix=plain, found=st.lists(st.tuples(names, arguments), max_size=2))
def test_streamed_text_is_never_taken_back(prefix: str, found: list[tuple[str, dict[str, Any]]]) -> None:
    """At every point of a stream, what `safe_prefix_len` lets the gateway show is a prefix of the
    final text: a client never sees text that turns out to be tool-call markup."""
    text = prefix + "".join(_block(name, args, compact=True) for name, args in found)
    final = parse_tool_calls(text).text
    shown = 0
    for cut in range(len(text) + 1):
        safe = safe_prefix_len(text[:cut])
        assert safe >= shown  # monotone: what was shown stays shown
        assert final.startswith(text[:safe])
        shown = safe


@functools.cache
def _tokenizer() -> Any:
    from reinforge.models import build_tokenizer

    return build_tokenizer(["hello world", "what is 2 + 2?"] * 10, vocab_size=300)


messages = st.lists(
    st.tuples(st.sampled_from(["system", "user", "assistant", "tool"]), plain), min_size=1, max_size=6
)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(history=messages, found=calls, as_string=st.booleans())
def test_template_renders_any_history_and_its_tool_calls_parse_back(
    history: list[tuple[str, str]], found: list[tuple[str, dict[str, Any]]], as_string: bool
) -> None:
    tool_calls = [
        {
            "id": f"call_{i}",
            "type": "function",
            "function": {
                "name": name,
                "arguments": json.dumps(args, ensure_ascii=False) if as_string else args,
            },
        }
        for i, (name, args) in enumerate(found)
    ]
    conversation: list[dict[str, Any]] = [{"role": role, "content": content} for role, content in history]
    conversation.append({"role": "assistant", "content": "", "tool_calls": tool_calls})
    rendered = _tokenizer().apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert rendered.startswith("<s>") and rendered.endswith("<|assistant|>")
    at = 0
    for _role, content in history:  # every message's text, in order
        found_at = rendered.find(content, at)
        assert found_at >= 0
        at = found_at + len(content)
    last_turn = rendered[rendered.rindex("<|assistant|>", 0, len(rendered) - 1) + len("<|assistant|>") :]
    reply = last_turn.removesuffix("<|assistant|>").removesuffix("</s>")
    parsed = parse_tool_calls(reply)
    assert not parsed.malformed
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == found
