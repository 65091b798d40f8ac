"""AttemptSpanBuffer: short attempts' spans are held for the finish; long or busy ones go live."""

from __future__ import annotations

import threading
import time

from reinforge.semconv import SPAN_FINAL_REWARD
from reinforge.tracing import AttemptSpanBuffer
from reinforge.types import Span


class ListSink:
    def __init__(self) -> None:
        self.spans: list[Span] = []

    def submit(self, span: Span) -> None:
        self.spans.append(span)


def _span(i: int) -> Span:
    return Span(rollout_id="r1", attempt_id="a1", name=f"s{i}")


def test_spans_are_held_until_taken_and_later_ones_pass_through() -> None:
    sink = ListSink()
    buffer = AttemptSpanBuffer(sink, hold_s=60.0, max_held=10)
    for i in range(3):
        buffer.submit(_span(i))
    assert sink.spans == [] and buffer.passed == 0
    assert [s.name for s in buffer.take()] == ["s0", "s1", "s2"]
    buffer.submit(_span(3))  # a span that ends after the finish was sent must still be written
    assert [s.name for s in sink.spans] == ["s3"] and buffer.passed == 1
    assert buffer.take() == []


def test_a_busy_attempt_passes_everything_on_in_order() -> None:
    sink = ListSink()
    buffer = AttemptSpanBuffer(sink, hold_s=60.0, max_held=4)
    for i in range(6):
        buffer.submit(_span(i))
    assert [s.name for s in sink.spans] == [f"s{i}" for i in range(6)]
    assert buffer.passed == 6 and buffer.take() == []


def test_a_long_attempt_goes_live_after_hold_s() -> None:
    sink = ListSink()
    buffer = AttemptSpanBuffer(sink, hold_s=0.05, max_held=100)
    buffer.submit(_span(0))
    time.sleep(0.08)
    buffer.submit(_span(1))
    assert [s.name for s in sink.spans] == ["s0", "s1"] and buffer.take() == []


def test_a_long_attempts_final_rewards_are_held_for_its_finish() -> None:
    sink = ListSink()
    buffer = AttemptSpanBuffer(sink, hold_s=0.05, max_held=2)
    buffer.submit(_span(0))
    time.sleep(0.08)
    buffer.submit(_span(1))
    assert [s.name for s in sink.spans] == ["s0", "s1"]  # live, as a long attempt goes
    final = Span(rollout_id="r1", attempt_id="a1", name=SPAN_FINAL_REWARD)
    buffer.submit(final)
    buffer.submit(_span(2))
    assert [s.name for s in sink.spans] == ["s0", "s1", "s2"] and buffer.passed == 3
    assert buffer.take() == [final]  # the gateway reads the reward from the finish, not the store
    buffer.submit(Span(rollout_id="r1", attempt_id="a1", name=SPAN_FINAL_REWARD))  # after the finish
    assert [s.name for s in sink.spans] == ["s0", "s1", "s2", SPAN_FINAL_REWARD] and buffer.take() == []


def test_spans_from_many_threads_are_each_kept_once() -> None:
    sink = ListSink()
    buffer = AttemptSpanBuffer(sink, hold_s=60.0, max_held=50)

    def work(offset: int) -> None:
        for i in range(25):
            buffer.submit(_span(offset + i))

    threads = [threading.Thread(target=work, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    names = [s.name for s in sink.spans] + [s.name for s in buffer.take()]
    assert sorted(names) == sorted(f"s{k * 100 + i}" for k in range(4) for i in range(25))
