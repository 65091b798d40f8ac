"""Cascade decode's shared prefix in panels, packed once for every step that reads it.

Cascade decode multiplies all rows' queries by the shared prefix's keys, then their probabilities by
its values: two small batched products per layer and step, which ATen runs at about half the rate the
panel kernel (`panel_linear.cpp`) reaches on the model's projections. The prefix does not change
while the same sequences decode, so its keys and values are packed into that kernel's panels at the
first step that reads them and reused until something writes below the prefix in the slot they came
from (docs/engine.md, "Prefix panels").
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from reinforge.engine.linear import panel_width, to_panels

Panels = tuple[torch.Tensor | None, torch.Tensor | None]
"""Keys `[kv_heads, positions / width, head_dim, width]` and values `[kv_heads, head_dim / width,
positions, width]`, or (None, None) where the panel kernel cannot take them."""


def pack_prefix(keys: torch.Tensor, values: torch.Tensor) -> Panels:
    """A prefix's keys and values (`[kv_heads, positions, head_dim]` each, as the cache holds them) in
    panels: the keys as the weight of the scores' product (positions padded with zeros to the panel
    width), the values transposed as the weight of the output's. (None, None) where the kernels cannot
    take them or the width does not divide the head size: cascade decode then multiplies the cache
    itself."""
    width = panel_width(keys, values)
    heads, positions, dim = keys.shape
    if not width or dim % width:
        return None, None
    padded = -(-positions // width) * width
    k = keys.new_zeros(heads, padded, dim)
    k[:, :positions] = keys
    return to_panels(k, width), to_panels(values.transpose(1, 2), width)


class PrefixPanels:
    """Each layer's panels of one prefix: the first `length` positions of cache slot `slot`."""

    def __init__(self) -> None:
        self._key: tuple[int, int] | None = None
        self._layers: dict[int, Panels] = {}

    def get(self, index: int, k_cache: torch.Tensor, v_cache: torch.Tensor, slot: int, length: int) -> Panels:
        """Layer `index`'s panels of `slot`'s first `length` positions (one layer's caches), packed now
        if this is not the prefix they were packed from."""
        if self._key != (slot, length):
            self._key, self._layers = (slot, length), {}
        panels = self._layers.get(index)
        if panels is None:
            panels = self._layers[index] = pack_prefix(k_cache[slot, :, :length], v_cache[slot, :, :length])
        return panels

    def written(self, writes: Mapping[int, int]) -> None:
        """Slot -> the first position something writes there: the panels go if that is below their
        prefix in their slot."""
        if self._key is not None:
            slot, length = self._key
            at = writes.get(slot)
            if at is not None and at < length:
                self.clear()

    def clear(self) -> None:
        self._key, self._layers = None, {}
