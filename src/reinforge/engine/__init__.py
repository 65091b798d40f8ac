"""The embedded inference engine: continuous batching for Hugging Face causal LMs, on CPU or CUDA."""

from reinforge.engine.engine import Engine, EngineDelta, EngineOutput
from reinforge.engine.errors import EngineError, EngineStoppedError
from reinforge.engine.process import EngineProcess, EngineProcessDiedError, EngineRestartPolicy

__all__ = [
    "Engine",
    "EngineDelta",
    "EngineError",
    "EngineOutput",
    "EngineProcess",
    "EngineProcessDiedError",
    "EngineRestartPolicy",
    "EngineStoppedError",
]
