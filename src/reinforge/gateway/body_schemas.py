"""JSON Schema for the parts of the call bodies that the gateway checks by hand.

Why by hand: messages, tools, tool choices, output formats and prompts are checked by the body
parsers (`openai_bodies.py`, `anthropic_bodies.py`) so that a refusal names the exact parameter and
says what to send instead; pydantic would word those refusals as union-branch errors. Their schema is
written here, next to nothing else, and attached to the body models' fields (`WithJsonSchema`,
`Documented`), so the published document (`openapi.py`) says what the parsers accept: `tests/fuzz`
sends what this document calls valid and checks it is served, and what it calls invalid and checks
it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import GetJsonSchemaHandler
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema

MAX_TOKEN_ID = 999_999_999
"""The largest token id a body may name (prompt ids, stop ids, logit-bias keys): above any vocabulary,
and within a 32-bit integer for clients in other languages."""
TOKEN_ID_KEY = r"^[0-9]{1,9}$"
"""A logit-bias key: a token id in decimal."""
MAX_TOKENS = 2**31 - 1
"""The largest `max_tokens` (or count) a body may ask for: a 32-bit integer."""
INT64 = (-(2**63), 2**63 - 1)
"""A seed's range (the engine's generators take 64 bits)."""


@dataclass(frozen=True)
class Documented:
    """Schema keywords for a check a validator or parser makes, added to the field's own schema
    (the check keeps its own message)."""

    keywords: dict[str, Any] = field(default_factory=dict)

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {**handler(core_schema), **self.keywords}

    def __hash__(self) -> int:
        return id(self)


@dataclass(frozen=True)
class OrText:
    """A list of blocks that may also be sent as one string (read as one text block)."""

    def __get_pydantic_json_schema__(
        self, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        return {"anyOf": [{"type": "string"}, handler(core_schema)]}


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _object(required: list[str], **properties: Any) -> dict[str, Any]:
    """An object with these properties; others are allowed (SDKs send back fields of their own)."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


TOKEN_ID: dict[str, Any] = {"type": "integer", "minimum": 0, "maximum": MAX_TOKEN_ID}

# -- OpenAI chat completions ---------------------------------------------------------------------------

TEXT_PART = _object(["text"], text={"type": "string"})
"""A content part the gateway reads: any part with a `text` string (text, input_text, output_text)."""
CONTENT = {"anyOf": [{"type": "string"}, {"type": "array", "items": TEXT_PART}, {"type": "null"}]}
CHAT_ROLES = ["system", "developer", "user", "assistant", "tool", "function"]
TOOL_CALL = _object(
    ["function"],
    function=_object(["name"], name={"type": "string"}, arguments={"type": ["string", "object"]}),
)
CHAT_MESSAGE = _object(
    ["role"],
    role={"enum": CHAT_ROLES},
    content=CONTENT,
    tool_calls=nullable({"type": "array", "items": TOOL_CALL}),
)
CHAT_MESSAGES = {"type": "array", "minItems": 1, "items": CHAT_MESSAGE}
CHAT_TOOLS = {
    "type": "array",
    "items": _object(
        ["type", "function"],
        type={"const": "function"},
        function=_object(["name"], name={"type": "string"}),
    ),
}
_NAME = {"type": "string", "minLength": 1}
_CHOICE_WORDS = {"enum": ["auto", "none", "required"]}
CHAT_TOOL_CHOICE = {
    "anyOf": [
        _CHOICE_WORDS,
        _object(["type", "function"], type={"const": "function"}, function=_object(["name"], name=_NAME)),
        # The responses API's flat spelling, read here too.
        _object(
            ["type", "name"], type={"const": "function"}, name=_NAME, function={"not": {"type": "object"}}
        ),
        {"type": "null"},
    ]
}
_TEXT_FORMAT = _object([], type={"enum": ["text", None]})
_JSON_OBJECT_FORMAT = _object(["type"], type={"const": "json_object"})
CHAT_RESPONSE_FORMAT = {
    "anyOf": [
        _TEXT_FORMAT,
        _JSON_OBJECT_FORMAT,
        _object(
            ["type", "json_schema"],
            type={"const": "json_schema"},
            json_schema=_object(["schema"], schema={"type": "object"}),
        ),
        {"type": "null"},
    ]
}
LOGIT_BIAS = nullable(
    {
        "type": "object",
        "propertyNames": {"pattern": TOKEN_ID_KEY},
        "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
    }
)
SAMPLES_NOT_STREAMED: dict[str, Any] = {
    "not": {
        "required": ["stream", "n"],
        "properties": {"stream": {"const": True}, "n": {"type": "integer", "minimum": 2}},
    }
}
"""n>1 is served without streaming (a body-level keyword: it ties two fields)."""

# -- OpenAI completions -----------------------------------------------------------------------------

_NON_EMPTY_IDS = {"type": "array", "minItems": 1, "items": TOKEN_ID}
PROMPT = {
    "anyOf": [
        {"type": "string", "minLength": 1},
        _NON_EMPTY_IDS,
        # A batch of one (batched prompts are refused).
        {"type": "array", "minItems": 1, "maxItems": 1, "items": {"type": "string", "minLength": 1}},
        {"type": "array", "minItems": 1, "maxItems": 1, "items": _NON_EMPTY_IDS},
    ]
}

# -- OpenAI responses -------------------------------------------------------------------------------

RESPONSES_ITEM = {
    "anyOf": [
        _object(
            ["role"],
            type={"const": "message"},
            role={"enum": ["system", "developer", "user", "assistant"]},
            content=CONTENT,
        ),
        _object(
            ["type", "name"],
            type={"const": "function_call"},
            name={"type": "string"},
            arguments={"type": "string"},
            call_id={"type": "string"},
        ),
        _object(
            ["type"],
            type={"const": "function_call_output"},
            output=CONTENT,
            call_id={"type": "string"},
        ),
    ]
}
RESPONSES_INPUT = {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": RESPONSES_ITEM}]}
RESPONSES_TOOLS = {
    "type": "array",
    "items": _object(["type", "name"], type={"enum": ["function", "custom"]}, name={"type": "string"}),
}
RESPONSES_REASONING = nullable(
    _object(
        [],
        effort={"enum": ["none", None]},
        summary={"enum": ["auto", "concise", "detailed", "none", None]},
    )
    | {"additionalProperties": False}
)
RESPONSES_TOOL_CHOICE = {
    "anyOf": [
        _CHOICE_WORDS,
        _object(["type", "name"], type={"const": "function"}, name=_NAME),
        {"type": "null"},
    ]
}
RESPONSES_TEXT = nullable(
    _object(
        [],
        verbosity={"enum": ["low", "medium", "high", None]},
        format=nullable(
            {
                "anyOf": [
                    _TEXT_FORMAT,
                    _JSON_OBJECT_FORMAT,
                    _object(["type", "schema"], type={"const": "json_schema"}, schema={"type": "object"}),
                ]
            }
        ),
    )
)
