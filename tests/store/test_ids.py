"""Ids the store indexes: valid OpenTelemetry shapes, sorted by creation, never repeated."""

from __future__ import annotations

import itertools
import os
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reinforge.gateway.service import new_id as gateway_response_id
from reinforge.store.span_records import parse_span_batch
from reinforge.store.sql.store import SqlStore
from reinforge.types import RolloutSpec, Span, new_ordered_id, new_span_id


def test_ordered_ids_are_trace_ids_that_sort_by_time() -> None:
    before = time.time_ns() // 1_000_000
    ids = [new_ordered_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
    assert len(set(ids)) == len(ids)
    millis = [int(i[:12], 16) for i in ids]
    assert millis == sorted(millis)
    assert before <= millis[0] and millis[-1] <= after
    # The 80 bits after the time are random: ids made in one millisecond differ there.
    assert len({i[12:] for i in ids}) == len(ids)


def test_span_ids_count_up_from_a_random_start() -> None:
    ids = [new_span_id() for _ in range(1000)]
    assert all(re.fullmatch(r"[0-9a-f]{16}", i) and i != "0" * 16 for i in ids)
    values = [int(i, 16) for i in ids]
    # Adjacent (mod 2**64, the one wrap a process could ever see): their index entries share pages.
    assert all((b - a) % 2**64 == 1 for a, b in itertools.pairwise(values))


def test_models_and_the_fast_path_use_them() -> None:
    a, b = Span(rollout_id="r", attempt_id="a", name="n"), Span(rollout_id="r", attempt_id="a", name="n")
    assert (int(b.span_id, 16) - int(a.span_id, 16)) % 2**64 == 1
    assert a.trace_id[:12] <= b.trace_id[:12]
    one = b'{"rollout_id":"r","attempt_id":"a","name":"n"}'
    raw = b'{"spans":[' + one + b"," + one + b"]}"
    records = parse_span_batch(raw, 10)
    assert records is not None
    first, second = (int(r.span_id, 16) for r in records)
    assert (second - first) % 2**64 == 1
    assert all(re.fullmatch(r"[0-9a-f]{32}", r.trace_id) for r in records)


@pytest.mark.parametrize(
    ("make", "width"), [(new_span_id, 16), (gateway_response_id, 24)], ids=["span", "gateway-response"]
)
def test_counting_ids_are_unique_hex_and_a_forked_child_has_its_own(
    make: Callable[[], str], width: int
) -> None:
    ids = [make() for _ in range(1000)]
    assert len(set(ids)) == len(ids)
    assert all(re.fullmatch(f"[0-9a-f]{{{width}}}", i) for i in ids)
    read, write = os.pipe()
    parent_next = make()
    pid = os.fork()
    if pid == 0:  # the child: report its next id and leave without running the test runner's exit
        os.write(write, make().encode())
        os._exit(0)
    os.close(write)
    child_next = os.read(read, 64).decode()
    os.close(read)
    os.waitpid(pid, 0)
    mine = make()
    assert re.fullmatch(f"[0-9a-f]{{{width}}}", child_next)
    # Without a new start the child would hand out exactly the parent's next id.
    assert child_next != mine
    assert (int(child_next, 16) - int(parent_next, 16)) % 2 ** (4 * width) != 1


async def test_the_sql_store_makes_ordered_rollout_and_attempt_ids(tmp_path: Path) -> None:
    store = await SqlStore.open(f"sqlite:///{tmp_path / 'store.db'}")
    try:
        made = await store.enqueue_rollouts([RolloutSpec(task={"k": k}) for k in range(3)])
        leased = await store.lease_rollouts("runner", max_rollouts=3, lease_seconds=60.0)
    finally:
        await store.close()
    rollout_ids = [r.rollout_id for r in made]
    attempt_ids = [lr.attempt.attempt_id for lr in leased]
    for ids in (rollout_ids, attempt_ids):
        assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
        assert [i[:12] for i in ids] == sorted(i[:12] for i in ids)
    assert rollout_ids[0][:12] <= attempt_ids[0][:12]
