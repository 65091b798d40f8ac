"""Which tasks each step trains on: a seeded shuffle per epoch, with a position that checkpoints save.

Resuming must continue with exactly the tasks the interrupted run would have drawn next, so the
order is a pure function of (seed, epoch) and the state is just (epoch, position).
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import BaseModel, ConfigDict

from reinforge.errors import InvalidRequestError


class SamplerState(BaseModel):
    model_config = ConfigDict(extra="forbid")

    epoch: int = 0
    position: int = 0


class TaskSampler:
    """Draws batches of task indices without replacement within an epoch."""

    def __init__(self, size: int, seed: int = 0, state: SamplerState | None = None) -> None:
        if size < 1:
            raise InvalidRequestError("the training dataset is empty")
        self.size = size
        self.seed = seed
        self.state = state or SamplerState()
        self._order = self._shuffled(self.state.epoch)

    def _shuffled(self, epoch: int) -> list[int]:
        order = list(range(self.size))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def next_batch(self, n: int) -> list[int]:
        batch: list[int] = []
        while len(batch) < n:
            if self.state.position >= self.size:
                self.state = SamplerState(epoch=self.state.epoch + 1, position=0)
                self._order = self._shuffled(self.state.epoch)
            take = min(n - len(batch), self.size - self.state.position)
            batch += self._order[self.state.position : self.state.position + take]
            self.state = SamplerState(epoch=self.state.epoch, position=self.state.position + take)
        return batch

    def state_dict(self) -> dict[str, Any]:
        return self.state.model_dump()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = SamplerState.model_validate(state)
        self._order = self._shuffled(self.state.epoch)
