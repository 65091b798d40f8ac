"""The chat template of the tiny models: compact, because a 1M-parameter model pays for every token.

Rendered format (one line per message here only for reading; there are no newlines between messages):

    <s><|system|>You are a calculator.
    calc(expression): evaluate a op b</s>
    <|user|>37+58*2=?</s>
    <|assistant|><tool_call>{"name":"calc","arguments":{"expression":"58*2"}}</tool_call></s>
    <|tool|>116</s>
    <|assistant|>

- Every message is `<|role|>` + content + `</s>`; `</s>` is also the EOS token, so generation stops at
  the end of the assistant's turn.
- Tools are rendered one per line as `name(param,...)` plus `: description` when there is one, at the
  end of the system message (a system message is opened if the conversation has none).
- Assistant tool calls use the Hermes/Qwen convention: `<tool_call>{"name":..,"arguments":{..}}
  </tool_call>`; `arguments` given as a JSON string (OpenAI's shape) is inserted as is.
- Message content may be a string or a list of OpenAI text parts.
"""

from __future__ import annotations

BOS = "<s>"
EOS = "</s>"
PAD = "<pad>"
ROLE_TOKENS: dict[str, str] = {
    "system": "<|system|>",
    "user": "<|user|>",
    "assistant": "<|assistant|>",
    "tool": "<|tool|>",
}
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"

# transformers renders with trim_blocks, so newlines are written as string expressions, not raw text.
# `message.role in role_tokens` keeps unknown roles (e.g. "developer") readable: they render as system.
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content -%}{%- for part in content -%}{%- if part.text is defined -%}{{ part.text }}"
    "{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro render_tools(tools) -%}"
    "{%- for tool in tools -%}"
    "{%- set f = tool.function if tool.function is defined else tool -%}"
    "{%- set params = f.parameters.properties if f.parameters is defined and f.parameters "
    "and f.parameters.properties is defined else {} -%}"
    "{%- if not loop.first -%}{{ '\\n' }}{%- endif -%}"
    "{{ f.name }}({{ params | join(',') }}){% if f.description %}: {{ f.description }}{% endif %}"
    "{%- endfor -%}"
    "{%- endmacro -%}"
    "{{- bos_token -}}"
    "{%- set first_is_system = messages and messages[0].role == 'system' -%}"
    "{%- if tools and not first_is_system -%}<|system|>{{ render_tools(tools) }}</s>{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'user' -%}<|user|>{{ text(message.content) }}</s>"
    "{%- elif message.role == 'assistant' -%}<|assistant|>{{ text(message.content) }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    '<tool_call>{"name":{{ fn.name | tojson }},"arguments":'
    "{%- if fn.arguments is string -%}{{ fn.arguments }}"
    "{%- else -%}{{ (fn.arguments if fn.arguments is defined else {}) | tojson(separators=(',', ':')) }}"
    "{%- endif -%}}</tool_call>"
    "{%- endfor -%}</s>"
    "{%- elif message.role == 'tool' -%}<|tool|>{{ text(message.content) }}</s>"
    "{%- else -%}<|system|>{{ text(message.content) }}"
    "{%- if loop.first and tools -%}{%- if text(message.content) -%}{{ '\\n' }}{%- endif -%}"
    "{{ render_tools(tools) }}{%- endif -%}</s>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
