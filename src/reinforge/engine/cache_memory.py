"""Zeroed KV-cache memory that costs nothing until it is written.

`torch.zeros` writes every byte of a new cache before the first forward, and the slot cache is
sized for the whole batch at full length (32 slots of an agent's ~800 tokens on SmolLM2-135M:
1.2 GB). On Linux a private anonymous mapping is zero by definition and backed page by page only
as it is first written, so a CPU cache taken from one skips that pass, and the capacity no
sequence reaches never becomes resident (docs/engine.md, "Cache memory"). The tensor owns the
mapping: it is unmapped when the last view of it is freed. Elsewhere (an accelerator, a platform
without `MAP_PRIVATE`, a small tensor) this is `torch.zeros`.
"""

from __future__ import annotations

import math
import mmap

import torch

_MIN_BYTES = 1 << 20
"""Below this a mapping's system calls cost more than writing the zeros."""


def zeroed(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor of `shape`; on the CPU, large ones from a fresh anonymous mapping."""
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes < _MIN_BYTES or not hasattr(mmap, "MAP_PRIVATE"):
        return torch.zeros(shape, device=device, dtype=dtype)
    memory = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(memory, dtype=dtype).view(shape)
