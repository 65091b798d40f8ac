"""What the gateway records survives the SQLite store's compressed span format: the same spans, the
same transitions for the trainer, the same text, token ids and logprobs for the dashboard, as from
a store that keeps spans as they came (the in-memory store)."""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import openai

from reinforge import semconv
from reinforge.access import attempt_token
from reinforge.credit import CreditConfig, build_transitions
from reinforge.gateway import create_gateway_app
from reinforge.inference import ScriptedBackend
from reinforge.inference.scripted import ScriptedReply, ScriptedToolCall
from reinforge.net.background import BackgroundServer
from reinforge.store import SqlStore, Store
from reinforge.store.memory import MemoryStore
from reinforge.types import (
    AttemptOutcome,
    AttemptQuery,
    AttemptStatus,
    RolloutSpec,
    Span,
    SpanQuery,
    Transition,
)

from .conftest import SECRET

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "Evaluate an arithmetic expression",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
_VOLATILE = {"span_id", "trace_id", "rollout_id", "attempt_id", "start_time", "end_time", "sequence"}


async def _run_agent(store: Store, tokenizer: Any, rollout_id: str) -> tuple[list[Span], list[Transition]]:
    """Three calls of a tool-using agent through a served gateway; its spans and transitions."""
    replies = [
        ScriptedReply(tool_calls=[ScriptedToolCall(name="calc", arguments={"expression": "3*4"})]),
        ScriptedReply(tool_calls=[ScriptedToolCall(name="calc", arguments={"expression": "2+12"})]),
        ScriptedReply(text="The answer is 14."),
    ]
    app = create_gateway_app(store, ScriptedBackend(tokenizer, replies), SECRET)
    with BackgroundServer(app) as server:
        await store.enqueue_rollouts([RolloutSpec(rollout_id=rollout_id, task={"q": "2+3*4"})])
        [leased] = await store.lease_rollouts("test-runner", max_rollouts=1)
        attempt_id = leased.attempt.attempt_id
        client = openai.AsyncOpenAI(
            base_url=f"{server.url}/r/{attempt_id}/v1",
            api_key=attempt_token(SECRET, attempt_id),
            max_retries=0,
        )
        messages: list[dict[str, Any]] = [{"role": "user", "content": "What is 2+3*4?"}]
        for _ in range(3):
            reply = await client.chat.completions.create(model="policy", messages=messages, tools=TOOLS)  # type: ignore[arg-type]
            message = reply.choices[0].message
            messages.append(message.model_dump(exclude_none=True, exclude={"refusal"}))
            for call in message.tool_calls or []:
                messages.append({"role": "tool", "tool_call_id": call.id, "content": "12"})
        await client.close()
        await app.state.gateway.flush(attempt_id)
    rollout = await store.finish_attempt(
        attempt_id, AttemptOutcome(status=AttemptStatus.succeeded, reward=1.0)
    )
    spans = (await store.query_spans(SpanQuery(rollout_ids=[rollout_id]))).items
    attempts = (await store.query_attempts(AttemptQuery(rollout_id=rollout_id))).items
    transitions, _ = build_transitions(rollout, spans, CreditConfig(mode="merged"), attempts=attempts)
    return spans, transitions


def _comparable(spans: list[Span]) -> Any:
    """The spans without what differs from run to run: ids, clocks, the tool calls' random ids."""
    dumped = []
    for span in spans:
        one = span.model_dump(mode="json", exclude=_VOLATILE)
        one["attributes"].pop(semconv.ATTR_LATENCY_MS, None)
        response = one["attributes"].get(semconv.ATTR_LLM_RESPONSE)
        if isinstance(response, dict):
            response.pop("id", None)
            response.pop("created", None)
        dumped.append(one)
    text = json.dumps(dumped)
    for n, call_id in enumerate(dict.fromkeys(re.findall(r"call_[0-9a-zA-Z]+", text))):
        text = text.replace(call_id, f"call-{n}")
    return json.loads(text)


async def test_recorded_llm_spans_read_back_from_sqlite_as_from_memory(
    tmp_path: Path, tokenizer: Any
) -> None:
    path = tmp_path / "store.db"
    sqlite = await SqlStore.open(f"sqlite:///{path}")
    memory = MemoryStore()
    try:
        from_sqlite, trained_sqlite = await _run_agent(sqlite, tokenizer, "calc-1")
        from_memory, trained_memory = await _run_agent(memory, tokenizer, "calc-1")
    finally:
        await sqlite.close()
        await memory.close()

    llm = [s for s in from_sqlite if s.name == semconv.SPAN_LLM_CALL]
    assert len(llm) == 3
    # Everything the dashboard shows: the request as sent, the answer, ids, logprobs, token counts.
    last = llm[-1].attributes
    sent = last[semconv.ATTR_LLM_REQUEST]["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "assistant", "tool"]
    assert sent[0]["content"] == "What is 2+3*4?"
    assert last[semconv.ATTR_LLM_RESPONSE]["choices"][0]["message"]["content"] == "The answer is 14."
    completion = last[semconv.ATTR_COMPLETION_TOKEN_IDS]
    assert tokenizer.decode(completion, skip_special_tokens=True).strip().startswith("The answer is 14")
    assert len(last[semconv.ATTR_COMPLETION_LOGPROBS]) == len(completion) > 0
    assert last[semconv.ATTR_LLM_RESPONSE]["usage"]["completion_tokens"] == len(completion)
    # The whole spans, and what the trainer makes of them, match the uncompressed store's.
    assert _comparable(from_sqlite) == _comparable(from_memory)
    assert len(trained_sqlite) == len(trained_memory) > 0
    for a, b in zip(trained_sqlite, trained_memory, strict=True):
        assert (a.prompt_ids, a.response_ids, a.response_mask) == (
            b.prompt_ids,
            b.response_ids,
            b.response_mask,
        )
        assert a.behaviour_logprobs == b.behaviour_logprobs

    with sqlite3.connect(path) as db:  # and SQLite kept them compressed
        assert {t for (t,) in db.execute("SELECT typeof(body) FROM spans")} == {"blob"}
