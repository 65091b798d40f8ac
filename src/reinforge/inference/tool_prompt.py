"""Tools for chat templates that render none: one default form, written into the messages.

Why: agents send tools the same way whatever the model (OpenAI `tools`, assistant `tool_calls`,
`tool` results), but a plain chat template (SmolLM2's ChatML, most base models') drops all three:
the model would never see its tools or its own earlier calls. Where the template does not render
tools, the conversation is rewritten into messages every template accepts, in the Hermes form the
tool-call parser (`inference.tool_calls`) reads back:

- the tools go at the end of the system message (one is opened when the conversation has none):
  an instruction, each tool's JSON schema on a line inside `<tools></tools>`, and how to call;
- an assistant turn's calls become its text: `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
  per call, one per line after the turn's text, `arguments` inserted as the model wrote them;
- consecutive tool results become one user turn of `<tool_response>\n...\n</tool_response>` blocks
  (`user`: a role every template accepts and every chat model was trained on).

docs/gateway.md shows a rendered prompt.
"""

from __future__ import annotations

import json
from typing import Any

from reinforge.inference.tool_calls import TOOL_CALL_END, TOOL_CALL_START

TOOL_RESPONSE_START = "<tool_response>"
TOOL_RESPONSE_END = "</tool_response>"
TOOLS_INSTRUCTION = (
    "You can call functions to help with the request. Their JSON schemas are within <tools></tools> tags:\n"
    "<tools>\n{tools}\n</tools>\n"
    "To call a function, reply with its name and arguments as a JSON object within "
    "<tool_call></tool_call> tags:\n"
    '<tool_call>{{"name": <function-name>, "arguments": <arguments-json-object>}}</tool_call>\n'
    "Function results come back within <tool_response></tool_response> tags."
)
"""The block appended to the system message; `{tools}` is one JSON schema per line."""

_PROBE_NAME = "reinforge_probe_tool_3f9c"
_PROBE_TOOL = {
    "type": "function",
    "function": {"name": _PROBE_NAME, "description": "", "parameters": {"type": "object", "properties": {}}},
}


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether `tokenizer`'s chat template writes the tools it is given into the prompt (a probe
    tool's name shows up in a rendered one-message conversation)."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "Hello"}],
            tools=[_PROBE_TOOL],
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception:  # jinja raises many types; a template that fails on tools does not render them
        return False
    return _PROBE_NAME in str(text)


def has_tool_content(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> bool:
    """Whether the request carries anything a template without tool support would drop."""
    return bool(tools) or any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def tools_as_text(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    generated: dict[int, list[int]] | None = None,
) -> tuple[list[dict[str, Any]], dict[int, list[int]]]:
    """`messages` with `tools`, tool calls and tool results written in the default form (module
    docstring), and `generated` re-indexed onto the new messages."""
    out: list[dict[str, Any]] = []
    moved: dict[int, int] = {}
    if tools:
        block = TOOLS_INSTRUCTION.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tools))
        if messages and messages[0].get("role") == "system":
            system = text_of(messages[0].get("content"))
            out.append({**messages[0], "content": f"{system}\n\n{block}" if system else block})
            moved[0] = 0
        else:
            out.append({"role": "system", "content": block})
    for index, message in enumerate(messages):
        if index in moved:
            continue
        role = message.get("role")
        if role == "tool":
            response = f"{TOOL_RESPONSE_START}\n{text_of(message.get('content'))}\n{TOOL_RESPONSE_END}"
            if index > 0 and messages[index - 1].get("role") == "tool" and out[-1].get("role") == "user":
                out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n{response}"}
            else:
                out.append({"role": "user", "content": response})
            continue
        moved[index] = len(out)
        if role == "assistant":
            rest = {k: v for k, v in message.items() if k != "tool_calls"}
            out.append({**rest, "content": assistant_text(message)})
        else:
            out.append({**message, "content": text_of(message.get("content"))})
    return out, {moved[i]: ids for i, ids in (generated or {}).items() if i in moved}


def assistant_text(message: dict[str, Any]) -> str:
    """An assistant message as text: its content, then one `<tool_call>` line per call."""
    parts = [text_of(message.get("content"))] if text_of(message.get("content")) else []
    for call in message.get("tool_calls") or []:
        function = call.get("function", call) if isinstance(call, dict) else {}
        arguments = function.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        name = json.dumps(function.get("name", ""), ensure_ascii=False)
        parts.append(f'{TOOL_CALL_START}{{"name": {name}, "arguments": {arguments}}}{TOOL_CALL_END}')
    return "\n".join(parts)


def text_of(content: Any) -> str:
    """Message content as a string: a string as is, OpenAI text parts joined, None as ""."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return str(content)
