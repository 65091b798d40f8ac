"""A command agent that traces itself with OpenTelemetry: its spans reach reinforge unchanged.

Run as a command by the runner (`CommandAgent`), the program reads its task and endpoint from the
environment, as any language would, and exports its traces with the stock OTLP/HTTP exporter, which
reads its endpoint and the attempt's key from the `OTEL_EXPORTER_OTLP_TRACES_*` variables the runner
sets. The calculator runs inside an `execute_tool` span (OpenTelemetry's GenAI conventions), so a
failed call is recorded with error status: an Automatic Intermediate Reward signal in training.

    .venv/bin/python examples/frameworks/otlp_agent.py --train [--minutes 5]   # train it
    REINFORGE_TASK='{"question": "2+3", "answer": 5}' OPENAI_BASE_URL=... python otlp_agent.py   # one run
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MAX_TURNS = 4


def solve(task: dict[str, Any]) -> float:
    from openai import OpenAI
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.trace import Status, StatusCode

    from reinforge.demo.agent import TOOL_ERROR_TEXT, parse_answer
    from reinforge.demo.calculator import CALCULATOR_TOOL, CalculatorError, call_calculator

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint and key: from env
    tracer = provider.get_tracer("calc-agent")
    client = OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY: from env
    messages: list[dict[str, Any]] = [{"role": "user", "content": str(task["question"])}]
    reward = 0.0
    try:
        for _ in range(MAX_TURNS):
            reply = (
                client.chat.completions.create(
                    model=os.environ.get("OPENAI_MODEL", "policy"),
                    messages=messages,
                    tools=[CALCULATOR_TOOL],
                    max_tokens=48,  # type: ignore[list-item,arg-type]
                )
                .choices[0]
                .message
            )
            if not reply.tool_calls:
                reward = 1.0 if parse_answer(reply.content) == int(task["answer"]) else 0.0
                break
            messages.append(reply.model_dump(exclude_none=True))
            for call in reply.tool_calls:
                with tracer.start_as_current_span(
                    "execute_tool calculator",
                    attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "calculator"},
                ) as span:
                    try:
                        result = str(call_calculator(call.function.arguments))  # type: ignore[union-attr]
                    except CalculatorError as exc:
                        span.set_status(Status(StatusCode.ERROR, str(exc)))
                        result = TOOL_ERROR_TEXT
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    finally:
        provider.shutdown()  # export what the batch processor still holds before the process exits
    return reward


def main() -> None:
    if "--train" not in sys.argv:
        print(f"REINFORGE_REWARD={solve(json.loads(os.environ['REINFORGE_TASK']))}")
        return
    sys.argv.remove("--train")
    from train_calc import train_calc  # beside this script (run as a script, its folder is on sys.path)

    from reinforge import CommandAgent

    train_calc(CommandAgent([sys.executable, os.path.abspath(__file__)], timeout_s=60), "otlp_agent")


if __name__ == "__main__":
    main()
