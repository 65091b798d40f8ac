"""Tools for chat templates that render none (SmolLM2's ChatML), and token-faithful history with that
model's real BPE: the default tool form, its parse back, and the policy's turns kept as their ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.warm_start import load_warm_start
from reinforge.inference.chat_render import ChatRenderer, contains_in_order
from reinforge.inference.tool_calls import parse_tool_calls
from reinforge.inference.tool_prompt import (
    assistant_text,
    template_renders_tools,
    tools_as_text,
)

from .real_tokenizer import smollm2_tokenizer

USER = {"role": "user", "content": "What is 417 * 23?"}


@pytest.fixture(scope="module")
def smollm2() -> Any:
    return smollm2_tokenizer()


def call_message(call_id: str, expression: str, content: str | None = None) -> dict[str, Any]:
    """An assistant turn as an OpenAI client sends it back (arguments re-dumped with spaces)."""
    arguments = json.dumps({"expression": expression})
    function = {"name": "calculator", "arguments": arguments}
    return {
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def result_message(call_id: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_the_probe_tells_a_template_with_tools_from_one_without(smollm2: Any) -> None:
    assert template_renders_tools(smollm2) is False
    assert template_renders_tools(load_warm_start()[1]) is True  # reinforge's tiny template renders them


def test_the_default_form_of_a_tool_conversation(smollm2: Any) -> None:
    messages = [USER, call_message("a", "417*23"), result_message("a", "9591")]
    text = smollm2.decode(ChatRenderer(smollm2).render(messages, [CALCULATOR_TOOL]))
    schema = json.dumps(CALCULATOR_TOOL)
    assert text == (
        "<|im_start|>system\n"
        "You can call functions to help with the request. "
        "Their JSON schemas are within <tools></tools> tags:\n"
        f"<tools>\n{schema}\n</tools>\n"
        "To call a function, reply with its name and arguments as a JSON object within "
        "<tool_call></tool_call> tags:\n"
        '<tool_call>{"name": <function-name>, "arguments": <arguments-json-object>}</tool_call>\n'
        "Function results come back within <tool_response></tool_response> tags.<|im_end|>\n"
        "<|im_start|>user\nWhat is 417 * 23?<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>{"name": "calculator", "arguments": {"expression": "417*23"}}'
        "</tool_call><|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n9591\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    # Without the fallback the template fails on the call's empty content, or else drops the tools
    # and the call: this is what the default form fixes.
    with pytest.raises(Exception, match="content"):
        smollm2.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False)
    messages[1]["content"] = ""
    bare = str(smollm2.apply_chat_template(messages, tools=[CALCULATOR_TOOL], tokenize=False))
    assert "calculator" not in bare and "<|im_start|>tool\n9591" in bare


def test_a_system_message_keeps_its_text_and_parallel_results_share_a_user_turn() -> None:
    turn = call_message("a", "1+2", content="Two sums.")
    turn["tool_calls"].append(
        {
            "id": "b",
            "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": "3+4"}},
        }
    )
    messages = [
        {"role": "system", "content": "Be brief."},
        USER,
        turn,
        result_message("a", "3"),
        result_message("b", "7"),
        {"role": "assistant", "content": "ANSWER: 10"},
    ]
    out, generated = tools_as_text(messages, [CALCULATOR_TOOL], {2: [5, 6], 5: [7]})
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert (
        out[0]["content"].startswith("Be brief.\n\nYou can call functions")
        and json.dumps(CALCULATOR_TOOL) in out[0]["content"]
    )
    assert out[2]["content"] == (
        'Two sums.\n<tool_call>{"name": "calculator", "arguments": {"expression": "1+2"}}</tool_call>\n'
        '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'
    )
    assert "tool_calls" not in out[2]
    assert out[3]["content"] == "<tool_response>\n3\n</tool_response>\n<tool_response>\n7\n</tool_response>"
    assert generated == {2: [5, 6], 4: [7]}  # the turns' new places
    assert messages[2]["tool_calls"][1]["function"]["arguments"] == {"expression": "3+4"}  # input untouched


def test_a_call_written_in_the_default_form_parses_back_as_written() -> None:
    text = assistant_text(call_message("a", "417*23", content="Let me compute."))
    parsed = parse_tool_calls(text)
    assert parsed.text == "Let me compute." and not parsed.malformed
    ((name, arguments),) = [(c.name, c.arguments) for c in parsed.tool_calls]
    assert (name, arguments) == ("calculator", '{"expression": "417*23"}')


def test_history_without_tools_still_shows_earlier_calls(smollm2: Any) -> None:
    """tool_choice "none" sends no tools; the conversation's calls and results still render."""
    messages = [USER, call_message("a", "417*23"), result_message("a", "9591")]
    text = smollm2.decode(ChatRenderer(smollm2).render(messages))
    assert "<tools>" not in text and "You are a helpful AI assistant named SmolLM" in text
    assert '"expression": "417*23"' in text and "<tool_response>\n9591\n</tool_response>" in text


def generated_ids(tokenizer: Any, text: str) -> list[int]:
    """A completion as a model writes it: text and markup tokenized apart, ending on EOS."""
    ids: list[int] = []
    for part in text.split("\x00"):
        ids += tokenizer(part, add_special_tokens=False)["input_ids"]
    return [*ids, tokenizer.eos_token_id]


def test_a_multi_turn_tool_conversation_keeps_every_generated_turn_with_the_real_bpe(smollm2: Any) -> None:
    """Each call's prompt + completion is a prefix of the next call's prompt (credit merges them),
    though the template would spell every earlier turn differently."""
    renderer = ChatRenderer(smollm2)
    # Completions with a text before the call (split from it by the BPE), key order and spacing of
    # the model's own: the default form re-spells each of them.
    completions = [
        "Let me compute.\x00"
        '<tool_call>{"arguments": {"expression":"417*23"}, "name": "calculator"}</tool_call>',
        '<tool_call>{"name":"calculator","arguments":{"expression":"9591+9"}}</tool_call>',
        "ANSWER: 9600",
    ]
    results = ["9591", "9600"]
    messages: list[dict[str, Any]] = [USER]
    generated: dict[int, list[int]] = {}
    previous: list[int] = []
    for turn, completion in enumerate(completions):
        prompt = renderer.render(messages, [CALCULATOR_TOOL], generated)
        assert prompt[: len(previous)] == previous  # the last call's prompt + completion, unchanged
        assert contains_in_order(prompt, [generated[k] for k in sorted(generated)])
        ids = generated_ids(smollm2, completion)
        plain = renderer.render(messages, [CALCULATOR_TOOL])
        if turn:
            assert plain[: len(previous)] != previous  # the re-spelt history would not have merged
        previous = prompt + ids
        parsed = parse_tool_calls(completion.replace("\x00", ""))
        assert not parsed.malformed
        generated[len(messages)] = ids
        messages.append(
            {
                "role": "assistant",
                "content": parsed.text,
                "tool_calls": [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                    for c in parsed.tool_calls
                ],
            }
        )
        for call in parsed.tool_calls:
            messages.append(result_message(call.id, results[turn]))
    assert len(generated) == 3 and len(messages) == 6
