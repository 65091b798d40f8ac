"""The KV cache's memory (`engine.cache_memory.zeroed`): zeros of the asked shape and dtype that can
be written like any tensor; on Linux a large one is resident only where it has been written, and
is given back when the tensor goes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from reinforge.engine.cache_memory import zeroed

CPU = torch.device("cpu")
MB = 1 << 20


def _resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


@pytest.mark.parametrize("shape", [(3, 5), (2, 4, 1 << 16)])  # under and over the mapping's threshold
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_zeroed_is_zeros_that_can_be_written(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    t = zeroed(shape, CPU, dtype)
    assert t.shape == shape and t.dtype == dtype and t.is_contiguous()
    assert not t.any()
    t[1, 2] = 7
    assert t[1, 2].eq(7).all() and int(t.ne(0).sum()) == t[1, 2].numel()
    view = t[:, 1:]  # slices and copies behave as on any tensor
    view.copy_(torch.ones_like(view))
    assert t[:, 1:].eq(1).all() and not t[:, 0].any()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_large_cache_is_resident_only_where_written_and_freed_with_its_tensor() -> None:
    before = _resident_bytes()
    t = zeroed((256, MB // 4), CPU, torch.float32)  # 256 MB
    assert _resident_bytes() - before < 32 * MB
    t[:128].fill_(1.0)  # write half of it
    written = _resident_bytes() - before
    assert 112 * MB < written < 192 * MB
    del t
    assert _resident_bytes() - before < written - 96 * MB
