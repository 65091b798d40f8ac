"""Deferred prefix copies: the bookkeeping on its own, then a runner that defers against one that
copies at once, through prefills, cascade and plain decode steps, verifies, moves of retained caches
and the overwriting of a slot others were copied from."""

from __future__ import annotations

import pytest
import torch

from reinforge.engine import fused
from reinforge.engine.deferred_copies import DeferredCopies, Move, RangeCopy
from reinforge.engine.model_runner import SlotCacheRunner


def test_a_prefix_copy_is_recorded_not_made() -> None:
    copies = DeferredCopies()
    before, now, after = copies.plan_moves([(0, 1, 70), (0, 2, 70)])
    assert (before, now, after) == ([], [], [])
    assert copies.pending(1) == (0, 70) and copies.pending(2) == (0, 70) and len(copies) == 2


def test_a_copy_of_a_deferred_slot_is_recorded_from_its_source() -> None:
    copies = DeferredCopies()
    copies.plan_moves([(0, 1, 70)])
    before, now, after = copies.plan_moves([(1, 5, 90)])  # slot 1 holds 70..89 itself
    assert (before, now) == ([], [])
    assert after == [(1, 5, 70, 90)]
    assert copies.pending(5) == (0, 70)
    copies.plan_moves([(1, 6, 40)])
    assert copies.pending(6) == (0, 40)


def test_writing_a_source_makes_the_copies_from_it_first() -> None:
    copies = DeferredCopies()
    copies.plan_moves([(0, 1, 70), (0, 2, 30)])
    before, now, after = copies.plan_moves([(3, 0, 50)])  # slot 0 is overwritten
    assert sorted(before) == [(0, 1, 0, 70), (0, 2, 0, 30)]
    assert (now, after) == ([], [])
    assert copies.pending(1) is None and copies.pending(2) is None
    assert copies.pending(0) == (3, 50)


def test_a_source_written_in_the_same_call_is_copied_now() -> None:
    copies = DeferredCopies()
    copies.plan_moves([(0, 1, 70)])
    # 1 moves to 4 while 4's cache moves to 1: both read before either is written.
    before, now, after = copies.plan_moves([(1, 4, 80), (4, 1, 60)])
    assert before == [(0, 1, 0, 70)]  # slot 1 is read and written: its deferred part is made first
    assert sorted(now) == [(1, 4, 80), (4, 1, 60)]
    assert after == [] and len(copies) == 0


def test_writes_copy_what_they_would_overwrite_and_shrink_what_they_rewrite() -> None:
    copies = DeferredCopies()
    copies.plan_moves([(0, 1, 70), (0, 2, 70)])
    assert copies.before_writes({0: 75, 1: 70, 2: 71}) == []  # all past the deferred parts
    assert copies.before_writes({0: 60}) == [(0, 1, 60, 70), (0, 2, 60, 70)]
    assert copies.pending(1) == (0, 60)
    assert copies.before_writes({1: 20}) == []  # slot 1 rewritten from 20: only 0..19 stay deferred
    assert copies.pending(1) == (0, 20)
    assert copies.before_writes({1: 0}) == [] and copies.pending(1) is None


def test_reads_below_the_cascade_make_the_copies_and_the_prefix_is_read_from_the_source() -> None:
    copies = DeferredCopies()
    copies.plan_moves([(5, 0, 70), (5, 1, 80), (5, 2, 70)])
    slot, made = copies.settle({0: 90, 1: 90, 2: 90}, range(3), 70, 0)
    assert slot == 5  # slot 0's first 70 positions live in slot 5
    assert made == [(5, 1, 70, 80)]  # slot 1's own positions past the shared 70
    assert copies.pending(1) == (5, 70)
    slot, made = copies.settle({0: 91}, range(3), 0, 0)  # a plain step reads every slot in full
    assert slot == 0 and sorted(made) == [(5, 0, 0, 70), (5, 1, 0, 70), (5, 2, 0, 70)]
    assert len(copies) == 0


def test_a_prefix_slot_holding_part_of_it_is_copied_whole() -> None:
    copies = DeferredCopies()
    copies.plan_moves([(5, 0, 40)])
    slot, made = copies.settle({}, range(0), 70, 0)
    assert slot == 0 and made == [(5, 0, 0, 40)]


class _Eager(DeferredCopies):
    """The reference: every move made at once (the staged path reads all sources first)."""

    def plan_moves(self, moves: list[Move]) -> tuple[list[RangeCopy], list[Move], list[RangeCopy]]:
        return [], list(moves), []


def _tokens(gen: torch.Generator, n: int) -> list[int]:
    return torch.randint(3, 270, (n,), generator=gen).tolist()


@pytest.mark.parametrize("kernels", [True, False])
def test_a_deferring_runner_computes_what_an_eager_one_does(
    llama: torch.nn.Module, monkeypatch: pytest.MonkeyPatch, kernels: bool
) -> None:
    if not kernels:
        monkeypatch.setenv(fused.ENABLE_ENV, "0")
    lazy = SlotCacheRunner(llama, 8, 160)
    eager = SlotCacheRunner(llama, 8, 160)
    eager._deferred = _Eager()
    gen = torch.Generator().manual_seed(11)
    system = _tokens(gen, 70)
    prompts = [system + _tokens(gen, 4 + 3 * i) for i in range(4)]
    lengths = [len(p) for p in prompts]
    outputs: dict[str, list[torch.Tensor]] = {"lazy": [], "eager": []}

    def both(call: str, *args: object, **kwargs: object) -> None:
        for name, runner in (("lazy", lazy), ("eager", eager)):
            result = getattr(runner, call)(*args, **kwargs)
            if result is not None:
                outputs[name].append(result)

    def steps(count: int, rows: int) -> None:
        for _ in range(count):
            both("decode", _tokens(gen, rows), lengths[:rows])
            for i in range(rows):
                lengths[i] += 1

    both("prefill", 0, prompts[:1])
    both("move_many", [(0, slot, 70) for slot in (1, 2, 3)])
    both("prefill", 1, prompts[1:], cached=[70] * 3)  # a cascade prefill, its prefix from slot 0
    if lazy._fused is not None:
        # The newcomers' prefixes were never copied: their slots are still untouched memory there.
        # (The eager path's prefill attends per prompt, reading each slot in full: it made them.)
        assert not lazy._k[:, 1:4, :, :70].any() and eager._k[:, 1:4, :, :70].any()
        assert len(lazy._deferred) == 3
    steps(3, 4)  # cascade decode over the 70 shared positions
    both("verify", [_tokens(gen, 2), _tokens(gen, 1), _tokens(gen, 3), _tokens(gen, 1)], lengths)
    lengths = [p + 1 for p in lengths]  # one fed token kept in each row (the rest rewritten below)
    # Slot 3's cache is retained in slot 6, then slot 1 ends: slot 3 moves into it, and 1 to slot 5.
    both("move_many", [(3, 6, lengths[3])])
    both("move_many", [(3, 1, lengths[3]), (1, 5, lengths[1])])
    lengths = [lengths[0], lengths[3], lengths[2]]
    steps(2, 3)
    # A newcomer copies 75 positions from the retained cache (70 of them deferred from slot 0 there),
    # alone: a plain prefill reads its slot in full.
    both("move_many", [(6, 3, 75)])
    newcomer = prompts[3][:75] + _tokens(gen, 6)
    both("prefill", 3, [newcomer], cached=[75])
    lengths.append(len(newcomer))
    steps(2, 4)
    # Slot 0, the source of the others' prefixes, is overwritten by slot 2's cache.
    both("move_many", [(2, 0, lengths[2])])
    lengths[0] = lengths[2]
    steps(2, 4)
    # A newcomer with another prompt: no shared prefix left, every step reads its slots in full.
    both("prefill", 4, [_tokens(gen, 30)])
    lengths.append(30)
    steps(2, 5)
    assert len(lazy._deferred) == 0
    assert len(outputs["lazy"]) == len(outputs["eager"]) == 16
    for got, expected in zip(outputs["lazy"], outputs["eager"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
