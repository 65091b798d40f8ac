"""Prefix copies between KV-cache slots, made only when something needs them.

Prefix reuse copies a donor's cached prefix into each newcomer's slot. On a CPU the copy itself is
cheap, but its destination is cache memory touched for the first time: every 4 KB of it is a page
fault, and on some virtual machines a slow one (docs/engine.md, "Deferred prefix copies"). Cascade
attention reads a prefix that all rows share from one slot and each row's own slot only after it,
so those copies are mostly never read. The runner therefore records a copy here instead of making
it, and makes it (or the part that matters) only when a slot's own positions below the cascade's
prefix are read, or when the slot it came from is about to be overwritten there.

An entry says: slot `dst`'s positions `[0, n)` hold what slot `src` holds there, `src` having them
in its own memory. Sources are never entries themselves (a copy from a slot whose copy is deferred
is recorded from that slot's source), so a slot's positions are found in at most one step.
"""

from __future__ import annotations

from collections.abc import Container, Mapping

RangeCopy = tuple[int, int, int, int]
"""(from slot, to slot, first position, end position): one copy the runner makes now."""

Move = tuple[int, int, int]
"""(from slot, to slot, length): a prefix copy as the engine asks for it (`ModelRunner.move_many`)."""


class DeferredCopies:
    """The prefix copies between slots that have been recorded but not made."""

    def __init__(self) -> None:
        self._pending: dict[int, tuple[int, int]] = {}  # dst -> (src, n): dst's [0, n) lives in src

    def __len__(self) -> int:
        return len(self._pending)

    def pending(self, slot: int) -> tuple[int, int] | None:
        """(source slot, length) if `slot`'s first positions are a copy not made yet."""
        return self._pending.get(slot)

    def clear(self) -> None:
        """Forget every entry: the cache they were about is gone."""
        self._pending.clear()

    def plan_moves(self, moves: list[Move]) -> tuple[list[RangeCopy], list[Move], list[RangeCopy]]:
        """Record `moves` (every source read before any destination is written, as `move_many`
        promises) and return what must be copied now, in three parts made in this order:
        - the entries these writes would break (a deferred copy from a slot written here, or of a
          slot both read and written here), made before anything else;
        - the moves whose source is itself written in this call (the runner stages their sources);
        - the parts of a move from a deferred slot that its own source does not hold, made last
          (they write a slot another move may still read)."""
        written = {dst for _, dst, _ in moves}
        read = {src for src, _, _ in moves}
        before: list[RangeCopy] = []
        for dst, (src, n) in list(self._pending.items()):
            if src in written or (dst in read and dst in written):
                before.append((src, dst, 0, n))
                del self._pending[dst]
        for dst in written:
            self._pending.pop(dst, None)  # overwritten: what is left past its new length is unused
        now: list[Move] = []
        after: list[RangeCopy] = []
        for src, dst, n in moves:
            if src in written:
                now.append((src, dst, n))
                continue
            entry = self._pending.get(src)
            if entry is None:
                self._pending[dst] = (src, n)
                continue
            root, held = entry
            self._pending[dst] = (root, min(n, held))
            if n > held:
                after.append((src, dst, held, n))
        return before, now, after

    def before_writes(self, writes: Mapping[int, int]) -> list[RangeCopy]:
        """Slot -> the first position a forward writes there. The copies to make first: the part of
        each entry from a written slot at or past that position. A written entry itself shrinks to
        the position (what it held past there is rewritten or no longer the slot's)."""
        copies: list[RangeCopy] = []
        for dst, (src, n) in list(self._pending.items()):
            at = writes.get(src)
            if at is not None and at < n:
                copies.append((src, dst, at, n))
                n = at
            at = writes.get(dst)
            if at is not None and at < n:
                n = at
            self._set(dst, src, n)
        return copies

    def before_reads(self, slots: Container[int], keep: int) -> list[RangeCopy]:
        """The copies to make before `slots` are read in their own memory from position `keep` on
        (0: all of it); their entries keep only the positions below `keep`."""
        copies: list[RangeCopy] = []
        for dst, (src, n) in list(self._pending.items()):
            if n > keep and dst in slots:
                copies.append((src, dst, keep, n))
                self._set(dst, src, keep)
        return copies

    def source(self, slot: int, length: int) -> tuple[int, list[RangeCopy]]:
        """The slot holding `slot`'s first `length` positions in its own memory, and the copies to
        make first: the source of `slot`'s entry where that covers them, else `slot` itself once its
        deferred copy is made."""
        entry = self._pending.get(slot)
        if entry is None or length == 0:
            return slot, []
        src, n = entry
        if n >= length:
            return src, []
        return slot, self.before_reads((slot,), 0)

    def settle(
        self, writes: Mapping[int, int], reads: Container[int], keep: int, prefix_of: int
    ) -> tuple[int, list[RangeCopy]]:
        """Before a forward that writes `writes` (`before_writes`), reads `reads` in their own memory
        from `keep` on (`before_reads`) and the first `keep` positions of `prefix_of` once for all
        rows (a cascade's shared prefix): the slot to read that prefix from, and the copies to make
        first."""
        copies = self.before_writes(writes) + self.before_reads(reads, keep)
        slot, more = self.source(prefix_of, keep)
        return slot, copies + more

    def _set(self, dst: int, src: int, n: int) -> None:
        if n > 0:
            self._pending[dst] = (src, n)
        else:
            self._pending.pop(dst, None)
