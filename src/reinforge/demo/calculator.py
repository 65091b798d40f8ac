"""The calculator tool of the calc demo: it evaluates exactly one `a op b`, nothing more.

Refusing longer expressions is the point: the agent has to split the problem into calls in the right
order, and a refused call is a tool error that Automatic Intermediate Rewards can penalise.
"""

from __future__ import annotations

import json
import re
from typing import Any

from reinforge.demo.tasks import apply
from reinforge.errors import InvalidRequestError

_BINARY = re.compile(r"^\s*(-?\d{1,6})\s*([+\-*])\s*(-?\d{1,6})\s*$")

CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Compute a op b",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
"""The OpenAI function-tool definition the agent passes as `tools=`. Short on purpose: the chat
template renders it into every prompt."""


class CalculatorError(InvalidRequestError):
    """The model asked for something the calculator does not do."""


def calculate(expression: str) -> int:
    """Evaluate `a op b` (op one of + - *). Anything else raises CalculatorError."""
    match = _BINARY.match(expression)
    if match is None:
        raise CalculatorError(f"calculator takes exactly 'a op b', got {expression!r}")
    a, op, b = int(match.group(1)), match.group(2), int(match.group(3))
    return apply(a, op, b)


def call_calculator(arguments: str) -> int:
    """Run a tool call from its JSON arguments text, as the model produced it."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError as exc:
        raise CalculatorError(f"tool arguments are not JSON: {arguments!r}") from exc
    if not isinstance(parsed, dict) or not isinstance(parsed.get("expression"), str):
        raise CalculatorError(f"tool arguments need a string 'expression', got {arguments!r}")
    return calculate(parsed["expression"])
