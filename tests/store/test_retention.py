"""Span retention in the SQLite store: bodies are compressed against a dictionary of recent spans
and read back unchanged."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from reinforge import semconv
from reinforge.errors import ReinforgeError
from reinforge.store import SqlStore
from reinforge.store.sql.span_codec import SpanBodyCodec
from reinforge.types import Span, SpanKind, SpanQuery, new_id, new_span_id

_TOOLS = [
    {
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
]


def _conversation(rollout_id: str, rng: random.Random, calls: int = 3) -> list[Span]:
    """An attempt's LLM spans as the gateway writes them: each call resends the turns so far, its
    prompt ids extend the previous call's, and every completion token has a logprob."""
    attempt_id = new_id()
    messages: list[dict[str, object]] = [
        {"role": "user", "content": f"{rng.randint(1, 99)}+{rng.randint(1, 99)}"}
    ]
    prompt_ids = [0, 3, 277, 14, 288, 15, 32] + [rng.randrange(400) for _ in range(12)]
    spans = []
    for seq in range(calls):
        completion = [rng.randrange(400) for _ in range(rng.randint(4, 12))]
        text = f"ANSWER: {rng.randint(1, 999)}"
        spans.append(
            Span(
                span_id=new_span_id(),
                trace_id=attempt_id,
                rollout_id=rollout_id,
                attempt_id=attempt_id,
                name=semconv.SPAN_LLM_CALL,
                kind=SpanKind.client,
                start_time=1_796_180_073.0 + seq,
                end_time=1_796_180_073.5 + seq,
                attributes={
                    semconv.ATTR_STEP_KIND: semconv.STEP_LLM,
                    semconv.ATTR_LLM_ENDPOINT: "chat.completions",
                    semconv.ATTR_LLM_REQUEST: {
                        "model": "reinforge-policy",
                        "messages": list(messages),
                        "max_tokens": 48,
                        "tools": _TOOLS,
                    },
                    semconv.ATTR_LLM_RESPONSE: {
                        "id": f"chatcmpl-{new_id()[:24]}",
                        "object": "chat.completion",
                        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                        "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(completion)},
                    },
                    semconv.ATTR_PROMPT_TOKEN_IDS: list(prompt_ids),
                    semconv.ATTR_COMPLETION_TOKEN_IDS: completion,
                    semconv.ATTR_COMPLETION_LOGPROBS: [-(rng.random() ** 4) for _ in completion],
                    semconv.ATTR_POLICY_VERSION: 3,
                    semconv.ATTR_FINISH_REASON: "stop",
                    semconv.ATTR_SEQUENCE_IN_ATTEMPT: seq,
                },
            )
        )
        messages += [{"role": "assistant", "content": text}, {"role": "tool", "content": str(seq)}]
        prompt_ids = prompt_ids + completion + [6, rng.randrange(400), 1, 5]
    return spans


def _plain_size(spans: list[Span]) -> int:
    return sum(len(s.model_dump_json(exclude={"sequence"})) for s in spans)


async def _write(url: str, spans: list[Span]) -> None:
    store = await SqlStore.open(url)
    try:
        for i in range(0, len(spans), 16):  # batches, as the gateway's recorder sends them
            assert await store.add_spans(spans[i : i + 16]) == len(spans[i : i + 16])
    finally:
        await store.close()


async def _read_all(store: SqlStore, **query: object) -> list[Span]:
    return (await store.query_spans(SpanQuery(limit=1000, **query))).items  # type: ignore[arg-type]


def _same(read: list[Span], written: list[Span]) -> None:
    assert [s.model_dump(exclude={"sequence"}) for s in read] == [
        s.model_dump(exclude={"sequence"}) for s in written
    ]


async def test_spans_read_back_unchanged_in_a_fraction_of_the_space(tmp_path: Path) -> None:
    rng = random.Random(7)
    spans = [s for i in range(80) for s in _conversation(f"r{i}", rng)]
    path = tmp_path / "store.db"
    await _write(f"sqlite:///{path}", spans)

    store = await SqlStore.open(f"sqlite:///{path}")
    try:
        _same(await _read_all(store), spans)
        # The trainer's read (rollout_ids, SQLite's raw-cursor path) and the filtered reads alike.
        _same(
            await _read_all(store, rollout_ids=["r5", "r70"]),
            [s for s in spans if s.rollout_id in ("r5", "r70")],
        )
        one = spans[100]
        _same(
            await _read_all(store, attempt_id=one.attempt_id),
            [s for s in spans if s.attempt_id == one.attempt_id],
        )
        _same(
            await _read_all(store, trace_id=one.trace_id, name=semconv.SPAN_LLM_CALL),
            [s for s in spans if s.trace_id == one.trace_id],
        )
        page = await store.query_spans(SpanQuery(rollout_id="r9", limit=2, offset=1))
        assert page.total == 3 and [s.span_id for s in page.items] == [s.span_id for s in spans[28:30]]
    finally:
        await store.close()

    with sqlite3.connect(path) as db:
        kinds = dict(db.execute("SELECT typeof(body), count(*) FROM spans GROUP BY 1").fetchall())
        stored = db.execute("SELECT sum(length(body)) FROM spans").fetchone()[0]
        assert db.execute("SELECT count(*) FROM span_dictionaries").fetchone()[0] == 1
    assert kinds == {"blob": len(spans)}
    # About 7x on these spans (the first 16 KB are compressed without a dictionary).
    assert stored * 4 < _plain_size(spans), (stored, _plain_size(spans))


# Stores written before compression (plain JSON bodies) and before the keyed span layout: see
# test_span_layout.py, which upgrades such a file and reads every old body beside new ones.


async def test_dictionaries_are_read_back_after_reopening_and_a_missing_one_is_named(tmp_path: Path) -> None:
    rng = random.Random(2)
    spans = [s for i in range(40) for s in _conversation(f"r{i}", rng)]
    path = tmp_path / "store.db"
    url = f"sqlite:///{path}"
    await _write(url, spans)
    store = await SqlStore.open(url)  # a fresh process: no dictionary in memory
    try:
        _same(await _read_all(store, rollout_id="r39"), spans[-3:])
    finally:
        await store.close()

    with sqlite3.connect(path) as db:
        (dict_id,) = db.execute("SELECT dict_id FROM span_dictionaries").fetchone()
        db.execute("DELETE FROM span_dictionaries")
    store = await SqlStore.open(url)
    try:
        _same(await _read_all(store, rollout_id="r0"), spans[:3])  # before the dictionary: none needed
        with pytest.raises(ReinforgeError, match=f"span dictionary {dict_id} is missing"):
            await _read_all(store, rollout_id="r39")
    finally:
        await store.close()


def test_every_batch_that_uses_a_dictionary_carries_it() -> None:
    """A batch whose transaction rolls back takes its dictionary row with it; the next batch must
    insert it again, so the codec hands the dictionary to every batch that uses it."""
    codec = SpanBodyCodec()
    bodies = [json.dumps({"n": i, "pad": "x" * 500, "r": random.Random(i).random()}) for i in range(200)]
    first, dictionary = codec.encode_batch(bodies[:100])
    assert dictionary is not None and len(dictionary[1]) == 16 * 1024 and dictionary[0] > 0
    again, same = codec.encode_batch(bodies[100:101])
    assert same == dictionary
    stored = {dictionary[0]: dictionary[1]}
    decoded = [codec.decode(b, stored.__getitem__) for b in first + again]
    assert decoded == bodies[:101]
    reader = SpanBodyCodec()  # another process: loads the dictionary by id
    assert reader.decode(again[0], stored.__getitem__) == bodies[100]


def test_an_unknown_body_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown span body format"):
        SpanBodyCodec().decode(b"\x07rest", lambda _: b"")
