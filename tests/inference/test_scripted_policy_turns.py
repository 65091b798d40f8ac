"""`turns_since_question`: where a warm start's scripted policy is in the conversation it plans."""

from __future__ import annotations

import pytest

from reinforge.errors import InvalidRequestError
from reinforge.inference import GenerationRequest
from reinforge.inference.scripted import turns_since_question


def test_the_last_user_turn_is_the_question_and_later_assistant_turns_are_counted() -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": "Use the tool."},
        {"role": "user", "content": "A demonstration question"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "7", "tool_call_id": "c0"},
        {"role": "assistant", "content": "ANSWER: 7"},
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is "}, {"type": "text", "text": "3+4*5?"}],
        },
    ]
    assert turns_since_question(GenerationRequest(messages=messages)) == ("What is 3+4*5?", 0)
    messages += [
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "20", "tool_call_id": "c1"},
        {"role": "assistant", "content": "", "tool_calls": []},
        {"role": "tool", "content": "23", "tool_call_id": "c2"},
    ]
    assert turns_since_question(GenerationRequest(messages=messages)) == ("What is 3+4*5?", 2)


def test_a_conversation_without_a_user_turn_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="user turn"):
        turns_since_question(GenerationRequest(messages=[{"role": "system", "content": "s"}]))
