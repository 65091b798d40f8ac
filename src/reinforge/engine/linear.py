"""The fast path's projections: weights pre-packed into oneDNN's blocked layout on CPU.

`F.linear` on a plain `[out, in]` weight hands the matrix to the BLAS transposed at every call; a
decode step multiplies a few dozen rows by every weight of the model, so that per-call repacking is
paid on the whole model each step. Packing each weight once (when the runner reads the weights) into
the layout oneDNN's kernels read, and multiplying with `torch.ops.mkldnn._linear_pointwise` (what
`torch.compile`'s freezing does on CPU), skips it (docs/engine.md, "Packed weights"). Elsewhere (a
GPU, a dtype or build without oneDNN) weights stay plain and `F.linear` runs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_PACKABLE = (torch.float32,)
_ROWS_HINT = 32
"""The rows per call oneDNN picks the blocked layout for: a decode step's batch. On this round's CPUs a
layout for 32 rows multiplied 8-64 rows and 716-row prefills as fast as one packed for their own count,
and the LM head's 32-row decode at twice the speed of one packed for 1 or 512 rows."""


def _can_pack(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in _PACKABLE
        and weight.dim() == 2
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (`[out, in]`) in the layout `linear` multiplies fastest: a copy where packed, so it
    must be packed again after the weight changes."""
    weight = weight.detach()
    if not _can_pack(weight):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _ROWS_HINT)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a plain or a packed `weight`."""
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
