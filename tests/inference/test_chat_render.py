"""ChatRenderer: the policy's own turns go into the next prompt as the ids it generated.

The shipped calc model's tokenizer and chat template, which spell a tool call compactly
(`{"name":"calculator","arguments":...}`): a completion written with spaces is what a sampled turn
can look like, and what the template would re-spell.
"""

from __future__ import annotations

from typing import Any

import pytest

from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.warm_start import load_warm_start
from reinforge.errors import InvalidRequestError
from reinforge.inference.chat_render import ChatRenderer, contains_in_order
from reinforge.inference.tool_calls import parse_tool_calls

SPACED = '<tool_call>{"name": "calculator", "arguments": {"expression": "8*16"}}</tool_call>'
COMPACT = '<tool_call>{"name":"calculator","arguments":{"expression":"8*16"}}</tool_call>'
USER = {"role": "user", "content": "8*16-20"}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return load_warm_start()[1]


def conversation(
    tokenizer: Any, completion: str, result: str = "128", user: dict[str, Any] = USER
) -> tuple[list[dict[str, Any]], list[int]]:
    """[user, the completion as an agent sends it back, the tool's result], and the completion's ids
    as generated (ending on the end-of-sequence token the model stops on)."""
    (call,) = parse_tool_calls(completion).tool_calls
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
        ],
    }
    tool = {"role": "tool", "tool_call_id": call.id, "content": result}
    ids = tokenizer(completion, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return [user, turn, tool], ids


def test_a_turn_the_template_respells_keeps_its_generated_ids(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    first = renderer.render([USER], [CALCULATOR_TOOL])
    messages, generated = conversation(tokenizer, SPACED)
    plain = renderer.render(messages, [CALCULATOR_TOOL])
    assert plain[: len(first)] == first and plain[len(first) : len(first) + len(generated)] != generated
    kept = renderer.render(messages, [CALCULATOR_TOOL], {1: generated})
    assert kept[: len(first) + len(generated)] == first + generated  # extends the call: it merges
    rest = kept[len(first) + len(generated) :]
    assert rest == plain[len(plain) - len(rest) :]  # the tool result and the next turn's start as before
    assert tokenizer.decode(rest).count("128") == 1


def test_two_generated_turns_both_keep_their_ids_in_order(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    messages, one = conversation(tokenizer, SPACED)
    second, two = conversation(tokenizer, SPACED.replace("8*16", "128-20"), "108")
    messages += second[1:]
    kept = renderer.render(messages, [CALCULATOR_TOOL], {1: one, 3: two})
    at_one = renderer.render(messages[:1], [CALCULATOR_TOOL])
    assert kept[len(at_one) : len(at_one) + len(one)] == one
    assert contains_in_order(kept, [one, two]) and not contains_in_order(kept, [two, one])
    # The prompt of the second turn's call, kept the same way, is a prefix of this one.
    at_two = renderer.render(messages[:3], [CALCULATOR_TOOL], {1: one})
    assert kept[: len(at_two) + len(two)] == at_two + two


def test_turns_spelt_as_the_template_or_cut_short_render_as_plain(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    messages, generated = conversation(tokenizer, COMPACT)
    assert renderer.render(messages, [CALCULATOR_TOOL], {1: generated}) == renderer.render(
        messages, [CALCULATOR_TOOL]
    )
    messages, generated = conversation(tokenizer, SPACED)
    plain = renderer.render(messages, [CALCULATOR_TOOL])
    assert renderer.render(messages, [CALCULATOR_TOOL], {1: generated[:-1]}) == plain  # no stop token
    assert renderer.render(messages, [CALCULATOR_TOOL], {2: generated}) == plain  # not an assistant turn
    assert renderer.render(messages, [CALCULATOR_TOOL], {7: generated}) == plain  # no such message


def test_messages_the_template_cannot_render_are_refused(tokenizer: Any) -> None:
    renderer = ChatRenderer(tokenizer)
    with pytest.raises(InvalidRequestError, match="empty"):
        renderer.render([])
    with pytest.raises(InvalidRequestError, match="role"):
        renderer.render([{"content": "no role"}])
