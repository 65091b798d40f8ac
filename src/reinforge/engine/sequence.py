"""One request as the engine's worker sees it: its prompt, sampling row, what it has generated, and
where its keys and values live (its slot and length)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Literal

from reinforge.engine.detokenizer import IncrementalDetokenizer
from reinforge.engine.sampling import RowParams
from reinforge.engine.speculation import NgramDrafter

EngineFinishReason = Literal["stop", "length"]


@dataclass
class EngineSequence:
    """Fields other than `cancelled` are touched only by the worker thread."""

    prompt: list[int]
    row: RowParams
    max_new: int
    stop_ids: frozenset[int]
    stops: list[str]
    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Any]]
    adapter: str | None = None
    """The adapter asked for; at admission, None unless the engine holds one of that name."""
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    unsent: int = 0
    version: int = 0
    slot: int = -1
    length: int = 0
    pending: int = -1
    detok: IncrementalDetokenizer | None = None
    drafter: NgramDrafter | None = None
    """Where speculation looks up draft tokens (built on the first step that speculates)."""
    finish_reason: EngineFinishReason | None = None
    cancelled: bool = False
    streaming: bool = True
    """Only streams get a token event per step: waking 64 `generate` callers every step for nothing
    would cost the event loop's thread (and the GIL the worker needs) more than the step itself."""

    @property
    def reserved(self) -> int:
        return len(self.prompt) + self.max_new
