"""The panel projections (`panel_linear.cpp` through `engine.linear`) multiply like `F.linear` for
every row count the engine feeds them (a decode's few rows, a block's tail, a prefill's many), with
and without a bias; they pack only what they can multiply; bad input is refused with a message."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from reinforge.engine import fused
from reinforge.engine.linear import linear, out_features, pack_weight

KERNELS: Any = fused.kernels()
WIDTH = int(KERNELS.panel_width()) if KERNELS is not None else 0
pytestmark = pytest.mark.skipif(WIDTH == 0, reason="no panel kernel on this CPU (AVX2/AVX-512 only)")


def _reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = x.double() @ weight.double().T
    return (out if bias is None else out + bias.double()).float()


@pytest.mark.parametrize("rows", [1, 2, 5, 7, 12, 13, 32, 37, 75, 300])
@pytest.mark.parametrize("with_bias", [False, True])
def test_panels_multiply_like_f_linear(rows: int, with_bias: bool) -> None:
    gen = torch.Generator().manual_seed(rows)
    out, inner = 3 * WIDTH, 70  # 70: no vector multiple, the inner loop has no tail to get wrong
    weight = torch.randn(out, inner, generator=gen)
    bias = torch.randn(out, generator=gen) if with_bias else None
    x = torch.randn(rows, inner, generator=gen)
    packed = pack_weight(weight)
    assert packed.shape == (3, inner, WIDTH)
    assert out_features(packed) == out
    got = linear(x, packed, bias)
    assert got.shape == (rows, out)
    torch.testing.assert_close(got, _reference(x, weight, bias), rtol=1e-5, atol=1e-4)


def test_a_strided_input_is_read_as_its_values() -> None:
    weight = torch.randn(WIDTH, 24)
    wide = torch.randn(9, 48)
    x = wide[:, ::2]  # not contiguous
    got = linear(x, pack_weight(weight), None)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_a_weight_the_panels_do_not_divide_stays_with_onednn_or_plain() -> None:
    weight = torch.randn(WIDTH + 3, 20)
    packed = pack_weight(weight)
    assert packed.dim() == 2 and out_features(packed) == WIDTH + 3
    x = torch.randn(4, 20)
    torch.testing.assert_close(linear(x, packed, None), F.linear(x, weight), rtol=1e-5, atol=1e-5)
    double = torch.randn(WIDTH, 20, dtype=torch.float64)
    assert pack_weight(double).dtype == torch.float64 and not pack_weight(double).is_mkldnn


def test_packing_copies_so_a_later_change_needs_a_repack() -> None:
    weight = torch.randn(WIDTH, 8)
    packed = pack_weight(weight)
    x = torch.randn(2, 8)
    before = linear(x, packed, None)
    weight.mul_(2)
    torch.testing.assert_close(linear(x, packed, None), before)
    torch.testing.assert_close(linear(x, pack_weight(weight), None), 2 * before, rtol=1e-5, atol=1e-5)


def test_turning_the_kernels_off_later_leaves_packed_weights_working(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    weight = torch.randn(WIDTH, 8)
    packed = pack_weight(weight)
    monkeypatch.setenv(fused.ENABLE_ENV, "0")
    x = torch.randn(3, 8)
    assert pack_weight(weight).dim() == 2  # new packs go elsewhere
    torch.testing.assert_close(linear(x, packed, None), F.linear(x, weight), rtol=1e-5, atol=1e-5)


def test_bad_input_is_refused_with_a_message() -> None:
    packed = pack_weight(torch.randn(WIDTH, 8))
    with pytest.raises(RuntimeError, match="x has 9 columns, the weight 8"):
        KERNELS.panel_linear(torch.zeros(2, 9), packed, None)
    with pytest.raises(RuntimeError, match="float32"):
        KERNELS.panel_linear(torch.zeros(2, 8, dtype=torch.float64), packed, None)
    with pytest.raises(RuntimeError, match="bias must be"):
        KERNELS.panel_linear(torch.zeros(2, 8), packed, torch.zeros(WIDTH + 1))
    with pytest.raises(RuntimeError, match="panels must be"):
        KERNELS.panel_linear(torch.zeros(2, 8), torch.zeros(1, 8, WIDTH + 1), None)
