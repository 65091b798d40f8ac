"""The fast path's projections: weights packed once, when the runner reads them, into the layout its
matmul kernel reads fastest.

A decode step multiplies a few dozen rows by every weight of the model. `F.linear` on a plain
`[out, in]` weight hands the matrix to the BLAS transposed at every call, so it repacks the whole
model each step. On a CPU with AVX2 or AVX-512 and the fused kernels built (`engine.fused`), weights
are stored in panels of output columns for `panel_linear.cpp`, which runs both a decode's few rows
and a prefill's many faster than oneDNN (docs/engine.md, "Panel projections"). Elsewhere on the CPU
they go to oneDNN's blocked layout, multiplied by `torch.ops.mkldnn._linear_pointwise` (what
`torch.compile`'s freezing does; docs/engine.md, "Packed weights"). On a GPU, or in a dtype or
build without either, weights stay plain and `F.linear` runs.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from reinforge.engine import fused

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


def panel_width(*tensors: torch.Tensor) -> int:
    """The output columns per panel of the compiled kernels where they can take `tensors`, else 0."""
    if not fused.usable(*tensors):
        return 0
    kernels = fused.kernels()
    return int(kernels.panel_width()) if kernels is not None else 0


def to_panels(matrix: torch.Tensor, width: int) -> torch.Tensor:
    """`matrix` (`[..., out, in]`, `out` a multiple of `width`) as panels `[..., out / width, in,
    width]`: the layout `panel_linear.cpp` reads, for the weights here and for cascade decode's
    prefix (`engine.prefix_panels`)."""
    *lead, out, inner = matrix.shape
    return matrix.reshape(*lead, out // width, width, inner).transpose(-2, -1).contiguous()


def _panel_width(weight: torch.Tensor) -> int:
    """The panel width the compiled kernels would pack `weight` in, or 0 where they cannot take it."""
    width = panel_width(weight) if weight.dim() == 2 else 0
    return width if width and weight.shape[0] % width == 0 else 0


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """`weight` (`[out, in]`) in the layout `linear` multiplies fastest: a copy where packed, so it
    must be packed again after the weight changes. Panels are `[out / width, in, width]`."""
    weight = weight.detach()
    width = _panel_width(weight)
    if width:
        return to_panels(weight, width)
    if not _can_pack(weight):
        return weight
    return torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), _ROWS_HINT)


def out_features(weight: torch.Tensor) -> int:
    """The output width of a plain, oneDNN-packed or panel-packed weight."""
    return int(weight.shape[0] * weight.shape[2]) if weight.dim() == 3 else int(weight.shape[0])


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for a plain or a packed `weight` (`x` is `[rows, in]`)."""
    if weight.dim() == 3:  # panels exist only where the kernels were loaded
        kernels: Any = fused.loaded()
        return kernels.panel_linear(x, weight, bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)
