"""The embedded inference engine: continuous batching of many concurrent requests in one process.

One worker thread owns the model and runs the scheduling loop; the asyncio side only submits requests
and reads results. Each loop iteration:

1. drops cancelled requests (a running one frees its slot at once);
2. applies a pending weight update once the running batch has drained: while an update waits, no new
   request starts, so a response is always produced by exactly one policy version;
3. admits waiting requests (FIFO) while the batch has free slots and the token budget allows, and
   prefills them packed together (no padding); a prompt that starts with tokens a running
   sequence already holds in its cache (rollouts of one task, a conversation going on) copies that KV
   and computes only its new tokens; so does one that starts with tokens of a finished sequence whose
   cache is still retained in a free slot (a conversation's next call, the next rollout of a task);
4. runs ONE decode forward for every running sequence and samples the next token of each; with
   speculation on, a sequence whose last tokens occurred earlier in its context also feeds the tokens
   that followed them there (drafts), and keeps those the model itself would have produced;
5. hands each request its new tokens (one callback per event loop per iteration).

Besides the base weights the engine may hold named LoRA adapters (`reinforge.engine.adapters`); a
request names its adapter, and rows of different adapters decode in the same batch.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import threading
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import torch
from transformers import PreTrainedTokenizerBase

from reinforge.engine.adapters import Adapter, LoraDelta, parse_adapters, split_state
from reinforge.engine.detokenizer import IncrementalDetokenizer, find_stop
from reinforge.engine.errors import EngineError, EngineStoppedError
from reinforge.engine.lifecycle import StartStop
from reinforge.engine.logit_shaping import GrammarCompiler, LogitShaper
from reinforge.engine.model_runner import ModelRunner, SlotCacheRunner, make_runner
from reinforge.engine.openmp import release_openmp_workers
from reinforge.engine.prefix_reuse import RetainedCache, RetainedCaches, plan_prefill, prefill_groups
from reinforge.engine.sampling import RowParams, sample
from reinforge.engine.sequence import EngineFinishReason, EngineSequence
from reinforge.engine.speculation import CHEAP_ROWS, CHEAP_ROWS_ACCELERATOR, NgramDrafter, share_rows
from reinforge.engine.weights import WeightsSource, apply_state_dict, check_state_dict, read_state_dict
from reinforge.errors import InvalidRequestError, PromptTooLongError
from reinforge.inference.contract import SamplingParams

logger = logging.getLogger(__name__)

_BURST_WAIT_S = 0.01
"""The longest an idle engine waits for the rest of a burst of requests before its first prefill."""
_BURST_GAP_S = 0.001
"""A burst has ended when no request arrived for this long."""


@dataclass(frozen=True)
class EngineOutput:
    """A finished generation. `logprobs[i]` is the logprob of `token_ids[i]` under the distribution
    it was sampled from (after shaping, temperature and truncation); see `reinforge.engine.sampling`."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: EngineFinishReason
    policy_version: int
    text: str
    """The completion decoded without special tokens, cut before a matched stop string."""
    num_prompt_tokens: int


@dataclass(frozen=True)
class EngineDelta:
    """Tokens produced since the previous delta of a stream, and the text they completed."""

    token_ids: list[int]
    logprobs: list[float]
    text: str


@dataclass
class _Update:
    state: Mapping[str, torch.Tensor]
    adapters: dict[str, Adapter]
    version: int
    loop: asyncio.AbstractEventLoop
    future: asyncio.Future[None]


class Engine(StartStop):
    """Serve one causal LM to many concurrent callers (see the module docstring for the loop).

    max_batch_size: the most sequences decoded together (slots); more requests queue.
    max_num_tokens: the most tokens (prompt + generation budget) reserved by running sequences.
    max_seq_len: the longest sequence (prompt + completion); defaults to the model's position limit.
    prefill_max_tokens: the most computed prompt tokens in one prefill forward, bounding activation memory.
    prefix_min_tokens: a new prompt whose first tokens (at least this many; 0 turns it off) are already
        cached by a running sequence copies that KV instead of recomputing it.
    retain_prefixes: keep a finished sequence's cache in a free slot (while slots are free) so later
        prompts can copy from it too; it never delays admission nor allocates memory of its own.
    seed: seeds the shared generator used by requests without their own seed.
    speculative_ngram: the most draft tokens a sequence feeds per step (prompt lookup,
        `reinforge.engine.speculation`; 0 turns speculation off). Outputs, logprobs and seeded samples
        are what the engine gives without it; only the number of forwards changes.
    speculative_rows: the most tokens (running sequences and drafts together) a forward takes while
        drafts are added; None: the device's `speculation.CHEAP_ROWS`, below which a forward costs
        about the same however many it takes. A batch this large gets no drafts.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        max_batch_size: int = 64,
        max_num_tokens: int | None = None,
        max_seq_len: int | None = None,
        policy_version: int = 0,
        prefill_max_tokens: int = 8192,
        prefix_min_tokens: int = 16,
        retain_prefixes: bool = True,
        seed: int | None = None,
        speculative_ngram: int = 0,
        speculative_rows: int | None = None,
    ) -> None:
        config = getattr(model, "config", None)
        limit = int(getattr(config, "max_position_embeddings", 0) or 2048)
        self.max_seq_len = min(max_seq_len or limit, limit)
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens or max_batch_size * self.max_seq_len
        if max_batch_size < 1 or self.max_num_tokens < self.max_seq_len:
            raise InvalidRequestError(
                f"need max_batch_size >= 1 and max_num_tokens >= max_seq_len ({self.max_seq_len}); "
                f"got {max_batch_size} and {self.max_num_tokens}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])  # type: ignore[operator]
        self.prefill_max_tokens = prefill_max_tokens
        self.prefix_min_tokens = prefix_min_tokens
        self.retain_prefixes = retain_prefixes
        if speculative_ngram < 0:
            raise InvalidRequestError(f"speculative_ngram must be >= 0; got {speculative_ngram}")
        self.speculative_ngram = speculative_ngram
        device = next(model.parameters()).device.type
        self.speculative_rows = speculative_rows or CHEAP_ROWS.get(device, CHEAP_ROWS_ACCELERATOR)
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self._grammars = GrammarCompiler(tokenizer, self.eos_token_ids)
        self._version = policy_version
        self._runner: ModelRunner = make_runner(model, max_batch_size, self.max_seq_len)
        self._shared_gen = torch.Generator()
        if seed is None:
            self._shared_gen.seed()
        else:
            self._shared_gen.manual_seed(seed)
        self._cond = threading.Condition()
        self._inbox: list[EngineSequence] = []
        self._updates: collections.deque[_Update] = collections.deque()
        self._waiting: collections.deque[EngineSequence] = collections.deque()
        self._running: list[EngineSequence] = []
        self._admitting: list[EngineSequence] = []
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._release_wanted = False
        self._steps = 0
        self._peak_running = 0
        self._prefix_hits = 0
        self._drafted = 0
        self._draft_hits = 0
        self._retained = RetainedCaches(prefix_min_tokens)
        self._adapters: dict[str, Adapter] = {}
        self._adapter_served: collections.Counter[str] = collections.Counter()

    # ---- lifecycle -------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """The version of the weights new requests are served with."""
        return self._version

    @property
    def uses_fast_path(self) -> bool:
        """True when the model runs on the slot-cache fast path (Llama-family architectures)."""
        return isinstance(self._runner, SlotCacheRunner)

    @property
    def adapter_names(self) -> list[str]:
        """The LoRA adapters requests can name (others are served by the base model)."""
        return sorted(self._adapters)

    def stats(self) -> dict[str, int]:
        """Counts for monitoring and tests: running sequences, waiting requests, decode steps, prompt
        tokens copied instead of computed (`prefix_cached_tokens`; `prefix_retained_hits` of them from
        retained caches of finished sequences), the caches retained now (`retained_entries`),
        draft tokens fed (`draft_tokens`) and kept (`draft_accepted`) by speculation, and
        `adapter_sequences/<name>`: sequences admitted with each adapter ("" for the base)."""
        with self._cond:
            return {
                "running": len(self._running),
                "waiting": len(self._waiting) + len(self._inbox),
                "steps": self._steps,
                "peak_running": self._peak_running,
                "prefix_cached_tokens": self._prefix_hits,
                "prefix_retained_hits": self._retained.hits,
                "retained_entries": len(self._retained.entries),
                "pending_updates": len(self._updates),
                "draft_tokens": self._drafted,
                "draft_accepted": self._draft_hits,
                **{f"adapter_sequences/{name}": n for name, n in self._adapter_served.items()},
            }

    def start(self) -> Self:
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the engine was stopped; create a new one")
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="reinforge-engine", daemon=True)
                self._thread.start()
                # This thread's OpenMP workers (from loading the model) would slow every parallel
                # region of the engine's thread; they come back if this thread computes again.
                release_openmp_workers()
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the worker; requests still queued or running fail with EngineStoppedError."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join(timeout)
        with self._cond:
            leftover = [*self._inbox, *self._waiting, *self._running]
            self._inbox.clear()
            self._waiting.clear()
            self._running.clear()
            self._retained.clear()
            updates = list(self._updates)
            self._updates.clear()
        error = EngineStoppedError("the engine stopped before the request finished")
        self._deliver([(s, ("error", error)) for s in leftover])
        for u in updates:
            u.loop.call_soon_threadsafe(_set_exception, u.future, error)

    def release_cache(self) -> None:
        """Hand the KV cache's memory back once no sequence runs (now, if none does). A trainer calls
        it before an update: the update makes every cached key and value stale, and on a machine
        where the engine and the update share memory the cache would otherwise sit beside the
        update's activations. The next admission allocates what it needs again."""
        with self._cond:
            self._release_wanted = True
            self._cond.notify_all()

    # ---- asyncio API -----------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, adapter: str | None = None
    ) -> EngineOutput:
        """Generate one completion with LoRA `adapter` (None, or a name the engine lacks: the base
        model); cancelling the awaiting task frees the request's slot."""
        seq = self._submit(prompt_ids, sampling or SamplingParams(), streaming=False, adapter=adapter)
        try:
            while True:
                kind, payload = await seq.queue.get()
                if kind == "done":
                    assert isinstance(payload, EngineOutput)
                    return payload
                if kind == "error":
                    raise payload
        finally:
            if seq.finish_reason is None:
                self._cancel(seq)

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, adapter: str | None = None
    ) -> AsyncIterator[EngineDelta | EngineOutput]:
        """Yield deltas as tokens are produced, then the EngineOutput. Text that might be the start
        of a stop string is held back, so streamed text always equals the final text."""
        params = sampling or SamplingParams()
        seq = self._submit(prompt_ids, params, streaming=True, adapter=adapter)
        detok = IncrementalDetokenizer(self.tokenizer)
        hold = max((len(s) for s in params.stop), default=1) - 1
        sent = 0
        try:
            while True:
                kind, payload = await seq.queue.get()
                if kind == "error":
                    raise payload
                if kind == "done":
                    assert isinstance(payload, EngineOutput)
                    if len(payload.text) > sent:
                        yield EngineDelta([], [], payload.text[sent:])
                    yield payload
                    return
                ids, lps = payload
                delta = detok.push([t for t in ids if t not in seq.stop_ids])
                ready = len(detok.text) - hold
                cut = find_stop(detok.text, seq.stops, len(delta)) if seq.stops and delta else None
                if cut is not None:  # the stop string just completed: never show it
                    ready = min(ready, cut)
                text = detok.text[sent:ready] if ready > sent else ""
                sent += len(text)
                yield EngineDelta(ids, lps, text)
        finally:
            if seq.finish_reason is None:
                self._cancel(seq)

    async def load_weights(self, weights: WeightsSource, version: int) -> None:
        """Swap in new weights between steps: requests already running finish on the old version,
        new ones wait until the update is applied, then carry `version`. Adapter tensors
        (`lora/<adapter>/<module path>.lora_A|lora_B|scale`, see `reinforge.engine.adapters`) may come
        with the base weights; an adapter named in the update is replaced whole."""
        if isinstance(weights, (str, Path)):
            state: Mapping[str, torch.Tensor] = await asyncio.to_thread(read_state_dict, weights)
        else:
            state = weights
        base, raw_adapters = split_state(state)
        check_state_dict(self.model, base)
        servable = self._runner.lora_modules
        if raw_adapters and not servable:
            raise InvalidRequestError(
                "this model runs on the engine's recompute path, which serves no LoRA adapters "
                f"(the update names {sorted(raw_adapters)})"
            )
        adapters = parse_adapters(self.model, raw_adapters, servable)
        if version < 0:
            raise InvalidRequestError("policy version must be >= 0")
        loop = asyncio.get_running_loop()
        update = _Update(base, adapters, version, loop, loop.create_future())
        with self._cond:
            self._updates.append(update)
            self._cond.notify_all()
        self.start()
        await update.future

    # ---- request intake (caller's thread) ---------------------------------------------------------

    def _submit(
        self, prompt_ids: list[int], sampling: SamplingParams, *, streaming: bool, adapter: str | None = None
    ) -> EngineSequence:
        prompt = [int(t) for t in prompt_ids]
        if not prompt:
            raise InvalidRequestError("the prompt is empty")
        bad = [t for t in prompt if not 0 <= t < self.vocab_size]
        if bad:
            raise InvalidRequestError(
                f"prompt token ids {bad[:5]} are outside the vocabulary [0, {self.vocab_size})"
            )
        room = self.max_seq_len - len(prompt)
        if room < 1:
            raise PromptTooLongError(len(prompt), self.max_seq_len)
        generator = None
        if sampling.seed is not None:
            generator = torch.Generator().manual_seed(sampling.seed)
        stops = [s for s in sampling.stop if s]
        seq = EngineSequence(
            prompt=prompt,
            row=RowParams(
                sampling.temperature,
                sampling.top_p,
                sampling.top_k,
                generator,
                LogitShaper(sampling, self._grammars) if sampling.shapes_logits else None,
            ),
            # A max_tokens beyond the context ends with finish_reason "length" at the context's end.
            max_new=min(sampling.max_tokens or room, room),
            stop_ids=frozenset(sampling.stop_token_ids) | self.eos_token_ids,
            stops=stops,
            loop=asyncio.get_running_loop(),
            queue=asyncio.Queue(),
            detok=IncrementalDetokenizer(self.tokenizer) if stops else None,
            streaming=streaming,
            adapter=adapter,
        )
        self.start()
        with self._cond:
            if self._stopping:
                raise EngineStoppedError("the engine is stopped")
            self._inbox.append(seq)
            self._cond.notify_all()
        return seq

    def _cancel(self, seq: EngineSequence) -> None:
        with self._cond:
            seq.cancelled = True
            self._cond.notify_all()

    # ---- the worker -------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._inbox or self._has_work()):
                    self._cond.wait()
                if not (self._stopping or self._has_work()):
                    self._gather_burst()
                if self._stopping:
                    return
                self._waiting.extend(self._inbox)
                self._inbox.clear()
            try:
                self._iteration()
            except Exception as exc:  # a failing forward must fail its requests, never hang them
                logger.exception("engine iteration failed")
                error = EngineError(f"the engine failed while generating: {exc!r}")
                with self._cond:
                    failed = list(
                        {id(s): s for s in (*self._admitting, *self._running, *self._waiting)}.values()
                    )
                    self._admitting.clear()
                    self._running.clear()
                    self._waiting.clear()
                    self._retained.clear()  # a failed forward may have left any slot half written
                self._deliver([(s, ("error", error)) for s in failed])

    def _has_work(self) -> bool:
        """Something for an iteration besides new requests (call with the lock held)."""
        return bool(self._waiting or self._running or self._updates or self._release_wanted)

    def _gather_burst(self) -> None:
        """An idle engine woken by a request waits (holding no lock) while more keep arriving, at most
        `_BURST_WAIT_S`: callers often send many requests at once (an agent's system prompt with many
        users, a group of rollouts), and admitting the first alone splits them into several prefills
        and runs a few decode steps for a batch of one (docs/engine.md, "Bursts")."""
        deadline = time.monotonic() + _BURST_WAIT_S
        while not self._stopping and time.monotonic() < deadline:
            seen = len(self._inbox)
            self._cond.wait(_BURST_GAP_S)
            if len(self._inbox) == seen:
                return

    def _iteration(self) -> None:
        with self._cond:
            self._waiting = collections.deque(s for s in self._waiting if not s.cancelled)
            cancelled = [s for s in self._running if s.cancelled]
            update = self._updates[0] if self._updates else None
            release = self._release_wanted and not self._running and not self._waiting
            if release:
                self._release_wanted = False
                self._retained.clear()  # the slots they point at are about to go
        if release:
            self._runner.release_cache()
        self._release(cancelled)
        if update is not None and not self._running:
            self._apply_update()
            update = None
        events: list[tuple[EngineSequence, tuple[str, Any]]] = []
        if update is None and self._waiting and len(self._running) < self.max_batch_size:
            self._admit(events)
        if self._running:
            self._decode(events)
        self._deliver(events)

    def _apply_update(self) -> None:
        with self._cond:
            updates = list(self._updates)
            self._updates.clear()
            # Retained caches hold the old weights' (and old adapters') keys and values.
            self._retained.clear()
        for u in updates:
            try:
                apply_state_dict(self.model, u.state)
                self._runner.refresh_weights()
                if u.adapters:
                    # Own copies: the caller's tensors (a trainer's live parameters, a shared buffer
                    # the next publish overwrites) must not change what is served.
                    self._adapters.update(
                        {
                            name: {
                                path: LoraDelta(d.a.detach().clone(), d.b.detach().clone(), d.scale)
                                for path, d in adapter.items()
                            }
                            for name, adapter in u.adapters.items()
                        }
                    )
                    self._runner.set_adapters(self._adapters)
                self._version = u.version
            except Exception as exc:
                u.loop.call_soon_threadsafe(
                    _set_exception, u.future, EngineError(f"weight update failed: {exc!r}")
                )
            else:
                u.loop.call_soon_threadsafe(_set_result, u.future)

    def _admit(self, events: list[tuple[EngineSequence, tuple[str, Any]]]) -> None:
        budget = self.max_num_tokens - sum(s.reserved for s in self._running)
        chosen: list[EngineSequence] = []
        while self._waiting and len(self._running) + len(chosen) < self.max_batch_size:
            head = self._waiting[0]
            if head.reserved > budget:
                break
            chosen.append(self._waiting.popleft())
            budget -= head.reserved
        with self._cond:  # adapters change only between batches, so this holds for a whole life
            for seq in chosen:
                if seq.adapter is not None and seq.adapter not in self._adapters:
                    seq.adapter = None
                self._adapter_served[seq.adapter or ""] += 1
        self._admitting = chosen  # if a forward fails, these fail too instead of hanging
        if chosen:
            # One cache allocation for what the batch will need, not a doubling (and a copy of every
            # cache) each time the sequences outgrow it; capped at twice the longest current length so
            # a request without max_tokens does not reserve the whole context for every slot. Slots for
            # the retained caches too, up to max_batch_size: they are free slots that stay useful.
            batch = [*self._running, *chosen]
            longest = max([s.length for s in self._running] + [len(s.prompt) for s in chosen])
            slots = min(self.max_batch_size, len(batch) + len(self._retained.entries))
            self._runner.reserve(slots, min(max(s.reserved for s in batch), max(64, 2 * longest)))
        sampled: list[tuple[list[EngineSequence], list[int], list[float]]] = []
        newcomers = sorted(chosen, key=lambda s: len(s.prompt))
        waves = [
            prefill_groups(wave, lambda item: len(item[0].prompt) - item[2], self.prefill_max_tokens)
            for wave in plan_prefill(newcomers, self._running, self._retained.entries, self.prefix_min_tokens)
        ]
        if waves:
            # Only wave 0 copies from retained caches (they count as running donors), so all its
            # copies go first, in one copy, before any of its prefills writes a slot one may live in;
            # the retained caches in slots the batch now covers move above it in that same copy.
            copies: list[tuple[int, int, int]] = []
            self._retained.tick()
            for i, (_, donor, shared) in enumerate(item for group in waves[0] for item in group):
                if donor is not None:
                    copies.append((donor.slot, len(self._running) + i, shared))
                    if isinstance(donor, RetainedCache):
                        self._retained.copied_from(donor, shared)
            capacity = self._runner.slot_capacity()
            self._runner.move_many(
                copies + self._retained.make_room(len(self._running) + len(chosen), capacity)
            )
        for index, groups in enumerate(waves):
            for group in groups:
                first = len(self._running)
                seqs = [seq for seq, _, _ in group]
                cached = [shared for _, _, shared in group]
                if index:
                    copied = [(d.slot, first + i, n) for i, (_, d, n) in enumerate(group) if d is not None]
                    self._runner.move_many(copied)
                logits = self._runner.prefill(
                    first, [s.prompt for s in seqs], cached, [s.adapter for s in seqs]
                )
                sampled.append((seqs, *sample(logits, [s.row for s in seqs], self._shared_gen)))
                self._enter(seqs, first)
                self._prefix_hits += sum(cached)
        # Accept only now: accepting may finish sequences and repack slots, which donors must not see.
        for admitted, tokens, logprobs in sampled:
            _take(admitted, tokens, logprobs)
            self._settle(admitted, events)
        self._admitting = []

    def _enter(self, group: list[EngineSequence], first: int) -> None:
        for i, seq in enumerate(group):
            seq.slot, seq.length, seq.version = first + i, len(seq.prompt), self._version
            self._running.append(seq)

    def _decode(self, events: list[tuple[EngineSequence, tuple[str, Any]]]) -> None:
        running = self._running
        self._peak_running = max(self._peak_running, len(running))
        drafts = (
            _drafts(running, self.speculative_ngram, self.speculative_rows) if self.speculative_ngram else []
        )
        if any(drafts):
            self._speculate(drafts, events)
            return
        logits = self._runner.decode(
            [s.pending for s in running], [s.length for s in running], [s.adapter for s in running]
        )
        for seq in running:
            seq.length += 1
        tokens, logprobs = sample(logits, [s.row for s in running], self._shared_gen)
        self._steps += 1
        seqs = list(running)
        _take(seqs, tokens, logprobs)
        self._settle(seqs, events)

    def _speculate(
        self, drafts: list[list[int]], events: list[tuple[EngineSequence, tuple[str, Any]]]
    ) -> None:
        """One verify forward for every running sequence's next token and drafts, then the tokens taken
        position by position: at each, every sequence still going samples exactly as a decode step
        would (its shaping, penalties and grammar seeing every token taken before; a seeded row drawing
        its noise from its generator in the same order), and goes on only while the sampled token is
        its draft. So the tokens and logprobs are those of plain decoding; a draft only saves forwards."""
        running = list(self._running)
        feeds = [[s.pending, *d] for s, d in zip(running, drafts, strict=True)]
        logits = self._runner.verify(feeds, [s.length for s in running], [s.adapter for s in running])
        self._steps += 1
        self._drafted += sum(map(len, drafts))
        starts = list(itertools.accumulate((len(f) for f in feeds), initial=0))
        going = list(range(len(running)))
        depth = 0
        while going:
            rows = logits.index_select(
                0, torch.tensor([starts[i] + depth for i in going], device=logits.device)
            )
            seqs = [running[i] for i in going]
            for seq in seqs:
                seq.length += 1
            tokens, logprobs = sample(rows, [s.row for s in seqs], self._shared_gen)
            _take(seqs, tokens, logprobs)
            hits = [
                i
                for i, token in zip(going, tokens, strict=True)
                if depth < len(drafts[i]) and token == drafts[i][depth]
            ]
            self._draft_hits += len(hits)
            going = [i for i in hits if running[i].finish_reason is None]
            depth += 1
        self._settle(running, events)

    def _settle(
        self, seqs: list[EngineSequence], events: list[tuple[EngineSequence, tuple[str, Any]]]
    ) -> None:
        """Hand out the tokens taken since the last event, finish the sequences that ended and free
        their slots."""
        finished: list[EngineSequence] = []
        for seq in seqs:
            if seq.streaming and len(seq.tokens) > seq.unsent:
                events.append((seq, ("tokens", (seq.tokens[seq.unsent :], seq.logprobs[seq.unsent :]))))
                seq.unsent = len(seq.tokens)
            if seq.finish_reason is not None:
                events.append((seq, ("done", _output(seq, self.tokenizer))))
                finished.append(seq)
        self._release(finished)

    def _release(self, ended: list[EngineSequence]) -> None:
        """Free the slots of `ended`, moving the last running sequences into them so slots stay
        packed; the caches move in one copy (from each moved sequence's slot before any move)."""
        if not ended:
            return
        moved: dict[int, tuple[EngineSequence, int]] = {}  # id -> (sequence, its slot before this call)
        with self._cond:
            for seq in sorted(ended, key=lambda s: s.slot, reverse=True):
                last = self._running.pop()
                if last is not seq:
                    moved.setdefault(id(last), (last, last.slot))
                    last.slot = seq.slot
                    self._running[seq.slot] = last
        moves = [(was, s.slot, s.length) for s, was in moved.values() if was != s.slot]
        # In the same copy (every source is read before any destination is written), the caches of
        # ended sequences whose slots the moved ones take go to the slots those leave.
        retain = self.retain_prefixes and self.prefix_min_tokens and not self._updates
        capacity = self._runner.slot_capacity()
        # A pending update would drop retained caches before anyone could copy from them.
        kept = self._retained.retain(ended, len(self._running), capacity) if retain and capacity else []
        self._runner.move_many(moves + kept)

    def _deliver(self, events: list[tuple[EngineSequence, tuple[str, Any]]]) -> None:
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[EngineSequence, tuple[str, Any]]]] = {}
        for seq, event in events:
            by_loop.setdefault(seq.loop, []).append((seq, event))
        for loop, items in by_loop.items():
            # A closed event loop raises RuntimeError: its callers are gone, nobody is waiting.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_put_all, items)


def _take(seqs: list[EngineSequence], tokens: list[int], logprobs: list[float]) -> None:
    """Append each sequence's new token and decide whether it ends the sequence."""
    for seq, token, logprob in zip(seqs, tokens, logprobs, strict=True):
        seq.tokens.append(token)
        seq.logprobs.append(logprob)
        seq.pending = token
        shaper = seq.row.shaper
        if token in seq.stop_ids or (shaper is not None and shaper.advance(token)):
            seq.finish_reason = "stop"
        elif seq.detok is not None:
            delta = seq.detok.push([token])
            if delta and find_stop(seq.detok.text, seq.stops, len(delta)) is not None:
                seq.finish_reason = "stop"
        if seq.finish_reason is None and len(seq.tokens) >= seq.max_new:
            seq.finish_reason = "length"


def _output(seq: EngineSequence, tokenizer: PreTrainedTokenizerBase) -> EngineOutput:
    assert seq.finish_reason is not None
    text_tokens = seq.tokens[:-1] if seq.tokens[-1] in seq.stop_ids else seq.tokens
    text = str(tokenizer.decode(text_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False))
    if seq.stops:
        cut = find_stop(text, seq.stops, len(text))
        if cut is not None:
            text = text[:cut]
    return EngineOutput(
        token_ids=list(seq.tokens),
        logprobs=list(seq.logprobs),
        finish_reason=seq.finish_reason,
        policy_version=seq.version,
        text=text,
        num_prompt_tokens=len(seq.prompt),
    )


def _drafts(running: list[EngineSequence], ngram: int, rows: int) -> list[list[int]]:
    """Each sequence's draft tokens: what followed the last occurrence of its latest tokens in its
    own context, no more than could still be kept (its token budget; the context's end), and only
    while the forward stays cheap (`speculation.CHEAP_ROWS`): a large batch already fills it, and
    there a draft costs about what a decoded token does, while most are rejected."""
    room = rows - len(running)
    if room <= 0:
        return []
    proposals = []
    for seq in running:
        limit = min(ngram, seq.max_new - len(seq.tokens) - 1)
        if seq.drafter is None:
            seq.drafter = NgramDrafter()
        proposals.append(seq.drafter.propose(seq.prompt + seq.tokens, limit))
    return share_rows(proposals, room)


def _put_all(items: list[tuple[EngineSequence, tuple[str, Any]]]) -> None:
    for seq, event in items:
        seq.queue.put_nowait(event)


def _set_result(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _set_exception(future: asyncio.Future[None], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _eos_ids(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """EOS from the tokenizer and from the model's generation config (which may list several)."""
    ids: set[int] = set()
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    elif isinstance(eos, (list, tuple)):
        ids.update(int(e) for e in eos)
    return frozenset(ids)
