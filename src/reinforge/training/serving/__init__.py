"""Serving the policy during training: one `WeightSync` per backend moves it to each new version.

`EmbeddedEngineSync` hands the weights to the embedded engine in memory; `VllmWeightSync` and
`SglangWeightSync` write them to a folder the server reads and call its weight-update (or LoRA
hot-load) endpoints. `RolloutStack.publish` runs a sync's switch with the gateway paused.
"""

from reinforge.training.serving.embedded import EmbeddedEngineSync
from reinforge.training.serving.protocol import (
    StagedWeights,
    WeightSync,
    WeightSyncError,
    switch_with_retries,
)
from reinforge.training.serving.upstream import SglangWeightSync, VllmWeightSync, adapter_name

__all__ = [
    "EmbeddedEngineSync",
    "SglangWeightSync",
    "StagedWeights",
    "VllmWeightSync",
    "WeightSync",
    "WeightSyncError",
    "adapter_name",
    "switch_with_retries",
]
