"""Prefix reuse for the engine's admissions: which cached prefix each newcomer copies (from a running
sequence, a retained cache of a finished one, or a newcomer of an earlier prefill wave), how the
prefills are grouped, and the retained caches of finished sequences kept in free slots.

Pure bookkeeping over token lists and slot numbers: the engine applies the returned slot moves with
its model runner, so this module never touches a tensor.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from reinforge.engine.sequence import EngineSequence

MAX_PREFILL_WAVES = 4
"""Prefill waves per admission at most (each a forward of its own): deeper chains of donors would cost
more forwards than the shared prefixes save."""

WAVE_COST_TOKENS = 16
"""What one more prefill wave costs, in prompt tokens computed: a wave is a forward of its own, which
reads every weight once however few tokens it computes. A newcomer copies from a newcomer of an
earlier wave only when that saves more tokens than this over copying from one a wave shallower: 31
agent prompts sharing a 675-token system prompt, each sharing a digit or two more with another, ran in
four waves instead of two (docs/engine.md, "Bursts")."""

SlotMove = tuple[int, int, int]
"""(from slot, to slot, cached length): one cache copy for the runner's `move_many`."""

DonorKey = tuple[str | None, tuple[int, ...]]
"""An adapter and the first `prefix_min_tokens` tokens: sequences only share KV within one adapter."""


@dataclass(eq=False)
class RetainedCache:
    """The cache of a finished sequence, kept in a free slot above the running ones so that a later
    prompt starting with the same tokens (the next call of a conversation, the next request on the same
    schema or template) copies it instead of recomputing it. Evicted, least recently used first, when
    the running sequences need its slot; dropped at every weight update (its KV is the old policy's)."""

    tokens: list[int]
    """The tokens whose keys and values are in slot positions 0..len-1."""
    adapter: str | None
    slot: int
    used: int
    """When it was retained or last copied from (the LRU clock of `RetainedCaches`)."""
    key: DonorKey


Prefill = tuple[EngineSequence, "EngineSequence | RetainedCache | None", int]
"""A newcomer, the sequence or retained entry whose cached prefix it copies (None: computed in full),
and that prefix's length."""


def plan_prefill(
    chosen: list[EngineSequence],
    running: list[EngineSequence],
    retained: list[RetainedCache],
    min_tokens: int,
) -> list[list[Prefill]]:
    """Waves of prefill for the newcomers: each copies the KV of the longest prefix (at least
    `min_tokens`; 0 turns reuse off) that a running sequence, a retained cache of a finished one, or a
    newcomer of an earlier wave has cached (rollouts of one task, tasks sharing a chat template and
    tools, a conversation going on), and computes only the rest. A wave is prefilled after the ones
    before it, so a group of identical prompts computes one prompt in full and one token for each of
    the others. Only sequences with the same adapter share: another adapter's KV of the same tokens
    differs."""
    k = min_tokens
    if not k:
        return [[(seq, None, 0) for seq in chosen]]
    donors: dict[DonorKey, list[tuple[EngineSequence | RetainedCache, list[int]]]] = {}
    for seq in running:
        cached = (seq.prompt + seq.tokens)[: seq.length]
        if len(cached) >= k:
            donors.setdefault((seq.adapter, tuple(cached[:k])), []).append((seq, cached))
    for entry in retained:  # after the running ones: on a tie, copy from a running sequence
        donors.setdefault(entry.key, []).append((entry, entry.tokens))
    wave_of: dict[int, int] = {}  # id(newcomer) -> its wave; running donors are wave -1
    first_of: dict[DonorKey, EngineSequence] = {}  # identical prompts (one adapter) copy the first
    waves: list[list[Prefill]] = []
    for seq in chosen:
        prompt = seq.prompt
        twin = first_of.get((seq.adapter, tuple(prompt)))
        donor: EngineSequence | RetainedCache | None = None
        shared = 0
        if twin is not None and len(prompt) > k and wave_of[id(twin)] + 1 < MAX_PREFILL_WAVES:
            donor, shared = twin, len(prompt) - 1  # at least the last token is computed
        else:
            best = 0
            for candidate, tokens in donors.get((seq.adapter, tuple(prompt[:k])), []):
                wave = wave_of.get(id(candidate), -1)
                if wave + 1 >= MAX_PREFILL_WAVES:
                    continue
                n = common_prefix(tokens, prompt, len(prompt) - 1)
                # A donor a wave deeper must save more than that wave's forward costs.
                score = n - WAVE_COST_TOKENS * (wave + 1)
                shallower = donor is not None and wave < wave_of.get(id(donor), -1)
                if donor is None or score > best or (score == best and shallower):
                    donor, shared, best = candidate, n, score
            if shared < k:
                donor, shared = None, 0
            if twin is None:
                first_of[(seq.adapter, tuple(prompt))] = seq
                if len(prompt) >= k:
                    donors.setdefault((seq.adapter, tuple(prompt[:k])), []).append((seq, prompt))
        wave = wave_of.get(id(donor), -1) + 1 if donor is not None else 0
        wave_of[id(seq)] = wave
        while len(waves) <= wave:
            waves.append([])
        waves[wave].append((seq, donor, shared))
    return waves


def prefill_groups(
    items: list[Prefill], cost: Callable[[Prefill], int], max_tokens: int
) -> list[list[Prefill]]:
    """Batches of at most `max_tokens` computed tokens (the runner packs prompts without padding), in
    order of cost, so a forward's activation memory stays bounded."""
    groups: list[list[Prefill]] = []
    used = 0
    for item in sorted(items, key=cost):
        if not groups or used + cost(item) > max_tokens:
            groups.append([])
            used = 0
        groups[-1].append(item)
        used += cost(item)
    return groups


class RetainedCaches:
    """The retained caches of finished sequences, with the LRU clock that orders their eviction and
    the count of prompt tokens copied from them."""

    def __init__(self, min_tokens: int) -> None:
        self.min_tokens = min_tokens
        self.entries: list[RetainedCache] = []
        self.clock = 0
        self.hits = 0

    def clear(self) -> None:
        self.entries.clear()

    def tick(self) -> int:
        self.clock += 1
        return self.clock

    def copied_from(self, entry: RetainedCache, tokens: int) -> None:
        entry.used = self.clock
        self.hits += tokens

    def retain(self, ended: list[EngineSequence], active: int, capacity: int) -> list[SlotMove]:
        """Keep the caches of `ended` (already out of the running list, `active` sequences left) in the
        free slots above the running ones, and return the moves that put them there. A cache that
        another retained one (same adapter) already holds as a prefix of its own is not kept twice (a
        group of identical greedy rollouts), and one it contains is replaced. Only the `capacity` slots
        the cache already has are used: retaining never allocates."""
        k = self.min_tokens
        by_key: dict[DonorKey, list[RetainedCache]] = {}
        for entry in self.entries:
            by_key.setdefault(entry.key, []).append(entry)
        dropped: set[int] = set()
        added: list[RetainedCache] = []
        clock = self.tick()
        for seq in ended:
            tokens = (seq.prompt + seq.tokens)[: seq.length]
            if len(tokens) < k:
                continue
            key = (seq.adapter, tuple(tokens[:k]))
            same = by_key.setdefault(key, [])
            holder = next((e for e in same if e.tokens[: len(tokens)] == tokens), None)
            if holder is not None:
                holder.used = clock
                continue
            for entry in [e for e in same if tokens[: len(e.tokens)] == e.tokens]:
                same.remove(entry)
                dropped.add(id(entry))
            entry = RetainedCache(tokens, seq.adapter, seq.slot, clock, key)
            same.append(entry)
            added.append(entry)
        kept = [e for e in (*self.entries, *added) if id(e) not in dropped]
        taken = {e.slot for e in kept if e.slot >= active}
        free = (slot for slot in range(active, capacity) if slot not in taken)
        moves: list[SlotMove] = []
        self.entries = []
        for entry in kept:
            if entry.slot < active:  # a running sequence moves into its slot now
                target = next(free, None)
                if target is None:
                    continue
                moves.append((entry.slot, target, len(entry.tokens)))
                entry.slot = target
            self.entries.append(entry)
        return moves

    def make_room(self, active: int, capacity: int) -> list[SlotMove]:
        """Clear slots `0..active-1` before the running sequences grow into them: the most recently
        used caches that fit in the free slots above move there, the others are evicted. Returns the
        moves (to run in one copy with the admission's prefix copies)."""
        if all(e.slot >= active for e in self.entries):
            return []
        room = max(0, capacity - active)
        kept = sorted(self.entries, key=lambda e: e.used, reverse=True)[:room]
        taken = {e.slot for e in kept if e.slot >= active}
        free = (slot for slot in range(active, active + room) if slot not in taken)
        moves: list[SlotMove] = []
        for entry in kept:
            if entry.slot < active:
                target = next(free)
                moves.append((entry.slot, target, len(entry.tokens)))
                entry.slot = target
        self.entries = kept
        return moves


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """The length of the common prefix of `a` and `b` (at most `limit`), by bisecting with slice
    comparisons: the planner compares each newcomer with every donor that shares its first tokens,
    and a token-by-token Python loop over long shared prompts cost more than the comparisons."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
