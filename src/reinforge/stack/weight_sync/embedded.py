"""The embedded engine's sync: the weights go over in memory (`Engine.load_weights`)."""

from __future__ import annotations

from reinforge.engine.engine import Engine
from reinforge.engine.process import EngineProcess
from reinforge.stack.weight_sync.protocol import ServedPolicy, StagedWeights


class EmbeddedEngineSync:
    """Publish to the engine in this process (or its child process): one shared LoRA adapter is
    merged in, per-role adapters go as adapter tensors (`Policy.engine_state`)."""

    def __init__(self, engine: Engine | EngineProcess) -> None:
        self.engine = engine

    async def check(self) -> None:
        return None

    async def stage(self, policy: ServedPolicy, version: int) -> StagedWeights:
        return StagedWeights(version=version, state=policy.engine_state())

    async def switch(self, staged: StagedWeights) -> None:
        assert staged.state is not None, "the embedded engine takes weights in memory"
        await self.engine.load_weights(staged.state, staged.version)

    async def aclose(self) -> None:
        return None
