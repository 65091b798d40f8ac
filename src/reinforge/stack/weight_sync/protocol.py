"""What serving the policy during training asks of a backend: take a new version, or say why not.

A sync has two halves so that the gateway holds calls only for the switch itself: `stage` writes the
new weights where the server can read them (or keeps them in memory for the embedded engine) while
calls still run on the old version; `switch` makes the server serve them, inside the gateway's pause,
and only returns once the new version answers every call. A switch that fails raises
`WeightSyncError` with the server's own words and leaves the old version serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch

from reinforge.errors import UpstreamError

log = logging.getLogger(__name__)


class WeightSyncError(UpstreamError):
    """A server refused or failed a weight update; the version it served before still serves."""


@dataclass(frozen=True)
class StagedWeights:
    """A policy version made ready to serve: in memory (`state`) or in a folder the server reads."""

    version: int
    state: Mapping[str, torch.Tensor] | None = None
    folder: Path | None = None


class ServedPolicy(Protocol):
    """What a sync reads from the trained policy (`reinforge.training.Policy` is one); typed here so
    that serving does not import training, which sits above it."""

    @property
    def model(self) -> torch.nn.Module:
        """The trained model (with its peft adapter when LoRA-trained)."""
        ...

    @property
    def lora(self) -> object | None:
        """The LoRA settings it trains with (None: full weights)."""
        ...

    @property
    def roles(self) -> Sequence[str]:
        """One adapter per role (empty: the full model, or one shared adapter)."""
        ...

    def engine_state(self) -> Mapping[str, torch.Tensor]:
        """The weights in the base model's names, as a server loads them."""
        ...


class WeightSync(Protocol):
    """Moves the serving backend to each new policy version (see the module docstring)."""

    async def check(self) -> None:
        """Fail early, with what to fix, when the backend can't be synced (no server, wrong model)."""
        ...

    async def stage(self, policy: ServedPolicy, version: int) -> StagedWeights:
        """Make `version`'s weights ready; the old version still serves."""
        ...

    async def switch(self, staged: StagedWeights) -> None:
        """Serve `staged` from now on. Called with no call in flight; raises WeightSyncError."""
        ...

    async def aclose(self) -> None: ...


async def switch_with_retries(
    sync: WeightSync, staged: StagedWeights, *, retries: int, delay_s: float
) -> None:
    """`sync.switch(staged)`, tried `retries` more times after a failure before giving up."""
    from reinforge.retry import Backoff

    retry = Backoff(delay_s, factor=1.0, tries=retries + 1).start()
    while True:
        try:
            await sync.switch(staged)
            return
        except WeightSyncError as exc:
            delay = retry.failed()
            if delay is None:
                raise
            log.warning(
                "weight sync to version %d failed (%s); retry %d of %d in %.1fs",
                staged.version,
                exc,
                retry.failures,
                retries,
                delay,
            )
            await asyncio.sleep(delay)
