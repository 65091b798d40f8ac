"""Serving the trained policy: one `WeightSync` per backend moves it to each new version.

`EmbeddedEngineSync` hands the weights to the embedded engine in memory; `VllmWeightSync` and
`SglangWeightSync` write them to a folder the server reads and call its weight-update (or LoRA
hot-load) endpoints. `RolloutStack.publish` runs a sync's switch with the gateway paused.
"""

from reinforge.stack.weight_sync.embedded import EmbeddedEngineSync
from reinforge.stack.weight_sync.protocol import (
    ServedPolicy,
    StagedWeights,
    WeightSync,
    WeightSyncError,
    switch_with_retries,
)
from reinforge.stack.weight_sync.upstream import SglangWeightSync, VllmWeightSync, adapter_name

__all__ = [
    "EmbeddedEngineSync",
    "ServedPolicy",
    "SglangWeightSync",
    "StagedWeights",
    "VllmWeightSync",
    "WeightSync",
    "WeightSyncError",
    "adapter_name",
    "switch_with_retries",
]
