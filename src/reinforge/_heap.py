"""Keep a long-lived process's startup heap out of the garbage collector's full collections.

A process that has imported torch and transformers (the trainer, the engine child, a runner child
whose agent module imports them) holds a few hundred thousand container objects that live until it
exits. Each full (generation 2) collection walks all of them, and the per-request allocations of a
busy process trigger one every few seconds: a pause of its event loop as long as a step's
generation, and a share of its CPU. `gc.freeze()` moves what is alive now to a permanent generation
that later collections skip; it is called once the process has built what it keeps for its life.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> None:
    """Collect what is already garbage, then exempt everything still alive from later collections
    (undone by `gc.unfreeze()`)."""
    gc.collect()
    gc.freeze()
