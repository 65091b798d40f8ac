"""The fused CPU kernels (engine.fused) compute what the eager path computes, kernel by kernel and
through a whole runner; bad input is refused with a message; a build that cannot happen leaves the
eager path serving."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerFast

from reinforge.engine import fused
from reinforge.engine.attention import additive, cascade_decode, visible
from reinforge.engine.model_runner import SlotCacheRunner
from reinforge.engine.prefix_panels import pack_prefix
from reinforge.models import tiny_llama

from .conftest import diversify

KERNELS: Any = fused.kernels()
# With a compiler on the machine the kernels must build (a failure is a bug, not a skip).
pytestmark = pytest.mark.skipif(
    KERNELS is None and not fused.compiler_available(), reason="no C++ compiler: the eager path serves"
)


def test_the_kernels_build_where_a_compiler_is() -> None:
    assert KERNELS is not None, fused.failure()


def _cache(
    slots: int, kv: int, cap: int, d: int, shared: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    k = torch.randn(slots, kv, cap, d, generator=gen)
    v = torch.randn(slots, kv, cap, d, generator=gen)
    k[1:, :, :shared] = k[0, :, :shared]  # the shared prefix really is shared
    v[1:, :, :shared] = v[0, :, :shared]
    return k, v


@pytest.mark.parametrize("window", [None, 7, 40])
@pytest.mark.parametrize(("heads", "kv"), [(4, 2), (3, 3), (9, 3)])
def test_cascade_decode_matches_the_eager_cascade(window: int | None, heads: int, kv: int) -> None:
    n, d, cap, shared = 5, 16, 64, 20
    k, v = _cache(6, kv, cap, d, shared, seed=heads * 10 + kv)
    q = torch.randn(n, heads, d, generator=torch.Generator().manual_seed(3))
    positions = [25, 31, 20, 44, 38]  # one row's own position is the prefix's last
    pos = torch.tensor(positions)
    span = max(positions) + 1
    scale = 1 / math.sqrt(d)
    bias = additive(visible(torch.arange(span), pos, window))[:, None, None]
    expected = cascade_decode(q, k, v, shared, span, bias, scale)
    got = KERNELS.cascade_decode(q, k, v, shared, pos, window or 0, scale, 0)
    assert got.shape == (n, heads, d)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 7])
def test_cascade_decode_reads_the_prefix_from_the_slot_named(window: int | None) -> None:
    # The runner defers prefix copies: the rows' own slots hold garbage below the shared prefix, and
    # the prefix is read from another slot (here 5, past the rows), by both cascades alike.
    n, heads, kv, d, cap, shared = 4, 6, 2, 16, 48, 18
    k, v = _cache(6, kv, cap, d, shared, seed=4)
    expected_k, expected_v = k.clone(), v.clone()
    k[:n, :, :shared], v[:n, :, :shared] = 1e4, -1e4
    q = torch.randn(n, heads, d, generator=torch.Generator().manual_seed(6))
    pos = torch.tensor([20, 18, 30, 25])
    span = 31
    bias = additive(visible(torch.arange(span), pos, window))[:, None, None]
    expected = cascade_decode(q, expected_k, expected_v, shared, span, bias, 0.25)
    torch.testing.assert_close(cascade_decode(q, k, v, shared, span, bias, 0.25, 5), expected)
    got = KERNELS.cascade_decode(q, k, v, shared, pos, window or 0, 0.25, 5)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 7, 40])
@pytest.mark.parametrize(("heads", "kv", "d", "shared"), [(4, 2, 32, 20), (9, 3, 64, 37), (6, 2, 64, 1)])
def test_cascade_decode_on_prefix_panels_matches_the_cache_products(
    window: int | None, heads: int, kv: int, d: int, shared: int
) -> None:
    """The prefix's two products on panels packed once (`prefix_panels.pack_prefix`) against ATen's batched
    products on the cache: prefixes that do and do not fill their last panel, the prefix read from
    another slot."""
    if not KERNELS.panel_width():
        pytest.skip("no panel kernel on this CPU")
    n, cap = 5, 96
    k, v = _cache(7, kv, cap, d, shared, seed=heads + d + shared)
    k[6, :, :shared], v[6, :, :shared] = k[0, :, :shared], v[0, :, :shared]
    q = torch.randn(n, heads, d, generator=torch.Generator().manual_seed(5))
    pos = torch.tensor([shared + 4, shared, shared + 30, shared + 11, shared + 2])
    k_panels, v_panels = pack_prefix(k[6, :, :shared], v[6, :, :shared])
    assert k_panels is not None and v_panels is not None
    width = KERNELS.panel_width()
    assert k_panels.shape == (kv, -(-shared // width), d, width) and v_panels.shape == (
        kv,
        d // width,
        shared,
        width,
    )
    expected = KERNELS.cascade_decode(q, k, v, shared, pos, window or 0, 0.2, 6)
    got = KERNELS.cascade_decode(q, k, v, shared, pos, window or 0, 0.2, 6, k_panels, v_panels)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_prefix_panels_of_the_wrong_shape_are_refused() -> None:
    if not KERNELS.panel_width():
        pytest.skip("no panel kernel on this CPU")
    k, v = _cache(2, 2, 64, 32, 20, seed=3)
    k_panels, v_panels = pack_prefix(k[0, :, :20], v[0, :, :20])
    assert k_panels is not None and v_panels is not None
    q, pos = torch.zeros(2, 4, 32), torch.tensor([45, 50])
    with pytest.raises(RuntimeError, match="prefix_k must be"):  # a prefix longer than the panels
        KERNELS.cascade_decode(q, k, v, 40, pos, 0, 1.0, 0, k_panels, v_panels)
    with pytest.raises(RuntimeError, match="prefix_v must be"):  # one within the same padded width
        KERNELS.cascade_decode(q, k, v, 21, pos, 0, 1.0, 0, k_panels, v_panels)
    with pytest.raises(RuntimeError, match="go together"):
        KERNELS.cascade_decode(q, k, v, 20, pos, 0, 1.0, 0, k_panels, None)


def test_cascade_decode_without_a_prefix_is_plain_attention() -> None:
    n, heads, kv, d = 3, 4, 2, 8
    k, v = _cache(n, kv, 32, d, 0, seed=5)
    q = torch.randn(n, heads, d)
    positions = [4, 9, 17]
    got = KERNELS.cascade_decode(q, k, v, 0, torch.tensor(positions), 0, 0.5, 0)
    for i, p in enumerate(positions):
        ref = F.scaled_dot_product_attention(
            q[i, :, None][None], k[i, :, : p + 1][None], v[i, :, : p + 1][None], enable_gqa=True, scale=0.5
        )
        torch.testing.assert_close(got[i], ref[0, :, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", [None, 5, 30])
def test_cascade_prefill_matches_attention_per_prompt(window: int | None) -> None:
    heads, kv, d, cap, shared = 6, 2, 16, 64, 21
    k, v = _cache(5, kv, cap, d, shared, seed=8)
    first_slot, starts, lens = 1, [21, 25, 30], [7, 1, 12]  # prompt 1: 4 cached positions of its own
    q = torch.randn(sum(lens), heads, d, generator=torch.Generator().manual_seed(2))
    # The prompts' slots hold garbage below the shared prefix: it is read from slot 0 only (the
    # runner defers the copies there).
    prefix_k, prefix_v = k[0, :, :shared].clone(), v[0, :, :shared].clone()
    k[first_slot:, :, :shared], v[first_slot:, :, :shared] = 1e4, -1e4
    got = KERNELS.cascade_prefill(
        q, k, v, first_slot, torch.tensor(starts), torch.tensor(lens), shared, window or 0, 0.3, 0
    )
    k[first_slot:, :, :shared], v[first_slot:, :, :shared] = prefix_k, prefix_v
    offset = 0
    for i, (c, n) in enumerate(zip(starts, lens, strict=True)):
        mask = visible(torch.arange(c + n), c + torch.arange(n), window)
        ref = F.scaled_dot_product_attention(
            q[offset : offset + n].transpose(0, 1)[None],
            k[first_slot + i, :, : c + n][None],
            v[first_slot + i, :, : c + n][None],
            attn_mask=mask,
            enable_gqa=True,
            scale=0.3,
        )
        torch.testing.assert_close(got[offset : offset + n], ref[0].transpose(0, 1), rtol=1e-5, atol=1e-5)
        offset += n


def test_cascade_prefill_refuses_a_prefix_past_a_prompts_start() -> None:
    k, v = _cache(2, 1, 16, 4, 0, seed=1)
    with pytest.raises(RuntimeError, match="shared prefix past its start"):
        KERNELS.cascade_prefill(
            torch.zeros(2, 1, 4), k, v, 0, torch.tensor([3, 5]), torch.tensor([1, 1]), 4, 0, 1.0, 0
        )
    with pytest.raises(RuntimeError, match="prefix slot 2 is outside the cache"):
        KERNELS.cascade_prefill(
            torch.zeros(2, 1, 4), k, v, 0, torch.tensor([3, 5]), torch.tensor([1, 1]), 2, 0, 1.0, 2
        )


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_rotates_and_writes_the_cache(qk_norm: bool) -> None:
    heads, kv, d, cap, rows = 4, 2, 16, 32, 6
    gen = torch.Generator().manual_seed(7)
    qkv = torch.randn(rows, (heads + 2 * kv) * d, generator=gen)
    cos = torch.randn(cap, d, generator=gen)
    sin = torch.randn(cap, d, generator=gen)
    norm = torch.randn(heads + kv, d, generator=gen) if qk_norm else None
    slots = torch.tensor([0, 0, 2, 2, 2, 3])
    pos = torch.tensor([5, 6, 0, 1, 2, 31])
    k_cache = torch.zeros(4, kv, cap, d)
    v_cache = torch.zeros(4, kv, cap, d)
    q = KERNELS.rope_store(qkv, heads, cos, sin, slots, pos, k_cache, v_cache, norm, 1e-6)

    qk = qkv[:, : (heads + kv) * d].view(rows, heads + kv, d)
    if norm is not None:
        qk = F.rms_norm(qk, (d,), None, 1e-6) * norm
    rotated = qk * cos[pos][:, None] + qk.roll(d // 2, dims=-1) * sin[pos][:, None]
    torch.testing.assert_close(q, rotated[:, :heads], rtol=1e-5, atol=1e-5)
    values = qkv[:, (heads + kv) * d :].view(rows, kv, d)
    for r in range(rows):
        torch.testing.assert_close(k_cache[slots[r], :, pos[r]], rotated[r, heads:], rtol=1e-5, atol=1e-5)
        assert torch.equal(v_cache[slots[r], :, pos[r]], values[r])
    written = {(int(s), int(p)) for s, p in zip(slots, pos, strict=True)}
    untouched = [(s, p) for s in range(4) for p in range(cap) if (s, p) not in written]
    assert all(not k_cache[s, :, p].any() and not v_cache[s, :, p].any() for s, p in untouched)


@pytest.mark.parametrize("post", [False, True])
def test_add_rms_norm(post: bool) -> None:
    gen = torch.Generator().manual_seed(9)
    x, y = torch.randn(40, 48, generator=gen), torch.randn(40, 48, generator=gen)
    w, post_w = torch.randn(48, generator=gen), torch.randn(48, generator=gen)
    total, normed = KERNELS.add_rms_norm(x, y, w, 1e-5, post_w if post else None, 1e-3)
    expected = x + (F.rms_norm(y, (48,), post_w, 1e-3) if post else y)
    torch.testing.assert_close(total, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(normed, F.rms_norm(expected, (48,), w, 1e-5), rtol=1e-5, atol=1e-5)


def test_silu_mul_covers_the_vector_tail() -> None:
    gate_up = torch.randn(7, 2 * 37) * 4  # 37: not a multiple of any vector width
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(KERNELS.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-6)


def test_bad_input_is_refused_with_a_message() -> None:
    k, v = _cache(2, 1, 8, 4, 0, seed=1)
    with pytest.raises(RuntimeError, match="float32"):
        KERNELS.cascade_decode(
            torch.zeros(2, 1, 4, dtype=torch.float64), k, v, 0, torch.tensor([1, 2]), 0, 1.0, 0
        )
    with pytest.raises(RuntimeError, match="outside the cache"):
        KERNELS.cascade_decode(torch.zeros(2, 1, 4), k, v, 0, torch.tensor([1, 8]), 0, 1.0, 0)
    with pytest.raises(RuntimeError, match="prefix slot -1 is outside the cache"):
        KERNELS.cascade_decode(torch.zeros(2, 1, 4), k, v, 1, torch.tensor([1, 2]), 0, 1.0, -1)
    with pytest.raises(RuntimeError, match="one entry per row"):
        KERNELS.cascade_decode(torch.zeros(2, 1, 4), k, v, 0, torch.tensor([1]), 0, 1.0, 0)
    with pytest.raises(RuntimeError, match="outside the cache"):
        table = torch.zeros(8, 4)
        KERNELS.rope_store(
            torch.zeros(1, 12), 1, table, table, torch.tensor([5]), torch.tensor([0]), k, v, None, 1e-6
        )


def test_the_runner_gives_the_same_logits_with_and_without_the_kernels(
    llama: torch.nn.Module, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Prefill (whole, then after a shared prefix), cascade decode over that prefix and a speculative
    verify, fused against eager."""
    gen = torch.Generator().manual_seed(4)
    shared = torch.randint(3, 270, (70,), generator=gen).tolist()
    batch = [shared + torch.randint(3, 270, (5 + 2 * i,), generator=gen).tolist() for i in range(4)]
    fused_runner = SlotCacheRunner(llama, 4, 128)
    monkeypatch.setenv(fused.ENABLE_ENV, "0")
    eager_runner = SlotCacheRunner(llama, 4, 128)
    assert fused_runner._fused is not None and eager_runner._fused is None
    for runner in (fused_runner, eager_runner):
        # The first prompt in full, then the others after its 70 shared positions (a cascade prefill).
        runner.logits = [runner.prefill(0, batch[:1])]  # type: ignore[attr-defined]
        runner.move_many([(0, slot, len(shared)) for slot in (1, 2, 3)])
        runner.logits.append(runner.prefill(1, batch[1:], cached=[len(shared)] * 3))  # type: ignore[attr-defined]
        positions = [len(p) for p in batch]
        runner.logits.append(runner.decode([3, 4, 5, 6], positions))  # type: ignore[attr-defined]
        step = [p + 1 for p in positions]
        runner.logits.append(runner.verify([[7, 8], [9], [10, 11, 12], [13]], step))  # type: ignore[attr-defined]
    for got, expected in zip(fused_runner.logits, eager_runner.logits, strict=True):  # type: ignore[attr-defined]
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_the_runner_packs_the_prefix_once_and_repacks_it_after_a_write_below_it(
    tokenizer: PreTrainedTokenizerFast, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cascade decode on the prefix's panels gives the logits it gives on the cache; the panels are
    packed at the first step that reads a prefix, reused by the next, kept by writes elsewhere and
    dropped by one into the prefix."""
    if not KERNELS.panel_width():
        pytest.skip("no panel kernel on this CPU")
    from reinforge.engine import prefix_panels

    # Heads of 64 (SmolLM2's), which both panel widths divide; grouped queries as there.
    sizes = {"hidden_size": 192, "num_heads": 3, "num_kv_heads": 1, "num_layers": 2, "intermediate_size": 256}
    llama = diversify(tiny_llama(tokenizer, **sizes), seed=3)

    gen = torch.Generator().manual_seed(8)
    shared = torch.randint(3, 270, (70,), generator=gen).tolist()
    batch = [shared + torch.randint(3, 270, (3 + i,), generator=gen).tolist() for i in range(5)]
    logits: dict[str, list[torch.Tensor]] = {}
    runners: dict[str, SlotCacheRunner] = {}
    for name in ("panels", "cache"):
        if name == "cache":
            monkeypatch.setattr(prefix_panels, "pack_prefix", lambda keys, values: (None, None))
        runner = runners[name] = SlotCacheRunner(llama, 8, 128)
        out = logits[name] = [runner.prefill(0, batch[:1])]
        runner.move_many([(0, slot, 70) for slot in (1, 2, 3)])
        out.append(runner.prefill(1, batch[1:4], cached=[70] * 3))
        positions = [len(p) for p in batch[:4]]
        for step in range(3):
            out.append(runner.decode([5 + step] * 4, [p + step for p in positions]))
            if name == "panels":
                assert len(runner._prefix_panels._layers) == len(runner.layers)  # one pack a layer, reused
        packed = runner._prefix_panels._layers
        runner.move_many([(0, 4, 70)])  # slot 4 written, slot 0 (the prefix's) not: the panels stay
        out.append(runner.prefill(4, batch[4:], cached=[70]))
        assert runner._prefix_panels._layers is packed
        positions = [p + 3 for p in positions] + [len(batch[4])]
        runner.move_many([(1, 0, positions[1])])  # the prefix's slot rewritten (slot 1's sequence): they go
        assert not runner._prefix_panels._layers
        positions[0] = positions[1]
        out.append(runner.decode([9] * 5, positions))
    assert all(k is not None for k, _ in runners["panels"]._prefix_panels._layers.values())
    assert all(k is None for k, _ in runners["cache"]._prefix_panels._layers.values())
    for got, expected in zip(logits["panels"], logits["cache"], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_a_build_that_fails_leaves_the_eager_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(fused, "_loaded", None)
    monkeypatch.setattr(fused, "_failure", None)
    monkeypatch.setenv(fused.DIR_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert fused.kernels() is None
    assert fused.failure()
    assert fused.kernels() is None  # asked once, not rebuilt at every runner


def test_the_switch_turns_them_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fused.ENABLE_ENV, "0")
    assert fused.kernels() is None
