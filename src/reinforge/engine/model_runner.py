"""Model runners: run a causal LM over per-sequence KV caches held in static slots.

Why static slots and not paged blocks: the engine's targets are small models on CPU and single GPUs
where sequences are short (hundreds to a few thousand tokens); a slot tensor
`[layers, slots, kv_heads, capacity, head_dim]` lets one decode step read every active sequence's cache
as a plain strided view (no gather, no block table), and keeping the active sequences packed in slots
`0..n-1` (a finished sequence's slot is refilled by moving the last one) makes that view `[:n]`.
A decode step is bound by reading that cache, so it is read in contiguous runs of slots
("length buckets"), each only up to its own longest sequence; a prefill packs every prompt's uncached
tokens into one unpadded batch for the matmuls and attends per prompt.
Capacity grows by doubling along both axes, so memory follows the live batch, bounded by
`max_slots * max_seq_len`.

Two runners share one interface:
- `SlotCacheRunner`: the fast path for the families in `reinforge.engine.architectures` (llama,
  mistral, qwen2, qwen3, gemma3): it runs the model's own weights with fused q/k/v and gate/up
  projections (packed once for the panel kernel or oneDNN on CPU, `engine.linear`), one forward per
  decode step for all active sequences; when the running sequences share a prefix, decode attention
  reads it once for all of them (`attention.cascade_decode`), and the copies of it that prefix reuse
  asks for are deferred until something reads or overwrites them (`engine.deferred_copies`).
  It also serves named LoRA adapters: each row (a decode slot, or a prompt's tokens in a prefill)
  names its adapter, the rows of one adapter are gathered and get that adapter's
  low-rank delta added to each projection, and rows with no adapter get none.
- `RecomputeRunner`: any other causal LM transformers can build: exact but recomputes every sequence
  in full at each step (no cache), so it is only for correctness on architectures the fast path lacks.
  It serves no adapters.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.nn.functional as F

from reinforge.engine.adapters import Adapter
from reinforge.engine.architectures import Architecture, describe, norm_eps
from reinforge.engine.attention import (
    additive,
    cascade_attention,
    cascade_decode,
    padded_mask,
    per_prompt_masks,
    visible,
)
from reinforge.engine.cache_memory import zeroed
from reinforge.engine.deferred_copies import DeferredCopies, RangeCopy
from reinforge.engine.errors import UnsupportedArchitectureError
from reinforge.engine.fused import kernels as fused_kernels
from reinforge.engine.fused import usable as fused_usable
from reinforge.engine.linear import linear, out_features, pack_weight
from reinforge.engine.prefix_panels import PrefixPanels
from reinforge.engine.prefix_reuse import common_prefix

# The cost of one more attention call, in cached positions read: splitting a decode batch into
# length buckets pays only when it skips more than this many keys. A call's fixed cost is worth a
# modest number of cached positions on CPU; on a GPU a kernel launch is worth vastly more positions,
# so buckets are cut only for large savings there (docs/engine.md, "Length buckets").
_BUCKET_OVERHEAD = {"cpu": 128}
_BUCKET_OVERHEAD_ACCELERATOR = 32768


_CASCADE_MIN_SHARED = 64
"""Cached positions every running sequence must share before decode reads them once for all (a shorter
shared prefix saves less than the cascade's extra matmuls cost)."""

_PADDED_CALL_SAVING = 4096
"""What one attention call fewer is worth in attention scores computed (a call's fixed cost, on CPU);
prefill pads prompts together while the padding costs less."""


def _pads_cheaply(starts: list[int], lens: list[int]) -> bool:
    """Whether one padded attention call beats one call per prompt for this prefill batch (never for
    one prompt with nothing cached: its own call needs no mask, so the causal kernel skips the masked
    half)."""
    if len(lens) == 1 and not starts[0]:
        return False
    exact = sum(n * (c + n) for c, n in zip(starts, lens, strict=True))
    padded = len(lens) * max(lens) * max(c + n for c, n in zip(starts, lens, strict=True))
    return padded <= 2 * exact + _PADDED_CALL_SAVING * (len(lens) - 1)


class ModelRunner(Protocol):
    """Computes next-token logits for sequences living in slots `0..n-1`."""

    def prefill(
        self,
        first_slot: int,
        prompts: list[list[int]],
        cached: list[int] | None = None,
        adapters: list[str | None] | None = None,
    ) -> torch.Tensor:
        """Fill slots `first_slot..first_slot+len(prompts)-1`; return float32 logits `[m, vocab]` at each
        prompt's last position. `cached[i]` leading positions of prompt i are already in its slot
        (copied from a sequence with the same prefix and adapter) and are not recomputed.
        `adapters[i]` names the adapter prompt i runs with (None or an unknown name: the base)."""
        ...

    def decode(
        self, tokens: list[int], positions: list[int], adapters: list[str | None] | None = None
    ) -> torch.Tensor:
        """Feed one token to each of slots `0..n-1` at its position (with slot i's adapter
        `adapters[i]`); return float32 logits `[n, vocab]`."""
        ...

    def verify(
        self, feeds: list[list[int]], positions: list[int], adapters: list[str | None] | None = None
    ) -> torch.Tensor:
        """Feed slot i the tokens `feeds[i]` (its next token and draft tokens) at positions
        `positions[i]` on (with adapter `adapters[i]`); return float32 logits `[sum of lengths, vocab]`
        at every fed position, row by row. Positions past what the caller keeps are overwritten later."""
        ...

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` cached positions of slot `src` into slot `dst` (`src` is unchanged)."""
        ...

    def move_many(self, moves: list[tuple[int, int, int]]) -> None:
        """Several `move(src, dst, length)`s at once, every source read before any destination is
        written; positions past a move's `length` may be copied too (they are written before they
        are ever read)."""
        ...

    def refresh_weights(self) -> None:
        """Re-read the model's parameters (after a weight update)."""
        ...

    def reserve(self, slots: int, length: int) -> None:
        """Make room for `slots` sequences of up to `length` tokens now, in one allocation, instead of
        growing (and copying the cache) several times while they decode."""
        ...

    lora_modules: frozenset[str]
    """The module paths an adapter may adapt (empty: this runner serves no adapters)."""

    def release_cache(self) -> None:
        """Free the KV cache's memory (called with no sequence running; every slot is empty after)."""
        ...

    def slot_capacity(self) -> int:
        """Slots the cache holds now. Those above the running sequences may keep finished sequences'
        caches for later prompts to copy (0: this runner keeps no KV worth keeping)."""
        ...

    def set_adapters(self, adapters: Mapping[str, Adapter]) -> None:
        """Serve exactly these adapters from now on (the runner keeps its own copies)."""
        ...


def make_runner(model: torch.nn.Module, max_slots: int, max_seq_len: int) -> ModelRunner:
    """The fast runner when the architecture is supported, the exact recompute runner otherwise."""
    try:
        return SlotCacheRunner(model, max_slots, max_seq_len)
    except UnsupportedArchitectureError:
        return RecomputeRunner(model)


class _Layer:
    """One decoder layer's weights, with q/k/v and gate/up concatenated so each is one matmul, and the
    family's norms as plain RMSNorm weights (a `1 + w` family's offset added once here)."""

    def __init__(self, layer: Any, arch: Architecture, heads: int, kv_heads: int) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv_w = pack_weight(torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
        biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        self.qkv_b = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
        self.o_w = pack_weight(attn.o_proj.weight)
        self.o_b = None if attn.o_proj.bias is None else attn.o_proj.bias.detach()
        self.gate_up_w = pack_weight(torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
        gate_b, up_b = mlp.gate_proj.bias, mlp.up_proj.bias
        self.gate_up_b = None if gate_b is None or up_b is None else torch.cat([gate_b, up_b]).detach()
        self.down_w = pack_weight(mlp.down_proj.weight)
        self.down_b = None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach()
        offset = arch.norm_offset
        self.ln1_w = _norm_weight(layer.input_layernorm, offset)
        self.eps = norm_eps(layer.input_layernorm)
        ffn_norm = layer.pre_feedforward_layernorm if arch.sandwich_norms else layer.post_attention_layernorm
        self.ln2_w = _norm_weight(ffn_norm, offset)
        self.post_attn_w: torch.Tensor | None = None
        self.post_mlp_w: torch.Tensor | None = None
        if arch.sandwich_norms:
            self.post_attn_w = _norm_weight(layer.post_attention_layernorm, offset)
            self.post_mlp_w = _norm_weight(layer.post_feedforward_layernorm, offset)
        self.qk_norm_w: torch.Tensor | None = None
        if arch.qk_norm:  # one [heads + kv_heads, head_dim] weight: q and k normalised in one call
            q_w = _norm_weight(attn.q_norm, offset)
            k_w = _norm_weight(attn.k_norm, offset)
            self.qk_norm_w = torch.cat([q_w.expand(heads, -1), k_w.expand(kv_heads, -1)])
            self.qk_eps = norm_eps(attn.q_norm)
        else:
            self.qk_eps = self.eps


def _norm_weight(norm: Any, offset: float) -> torch.Tensor:
    weight = norm.weight.detach()
    return weight + offset if offset else weight


_FUSED = {"q": ("qkv", 0), "k": ("qkv", 1), "v": ("qkv", 2), "o": ("o", 0)}
_FUSED |= {"gate": ("gate_up", 0), "up": ("gate_up", 1), "down": ("down", 0)}
"""Projection -> (the fused matmul it is part of, its place in it)."""


@dataclass(frozen=True)
class _LayerLora:
    """One adapter's deltas for one layer, per fused matmul: `(A, B)` with A `[R, in]` the
    projections' A stacked and B `[out, R]` block-diagonal (scale folded in), so a fused matmul's
    delta is two matmuls whatever subset of its projections the adapter adapts."""

    qkv: tuple[torch.Tensor, torch.Tensor] | None
    o: tuple[torch.Tensor, torch.Tensor] | None
    gate_up: tuple[torch.Tensor, torch.Tensor] | None
    down: tuple[torch.Tensor, torch.Tensor] | None


_Groups = list[tuple[list[_LayerLora], torch.Tensor | None]]
"""Per adapter in a forward: its layers' deltas and the rows it applies to (None: every row)."""


@dataclass(frozen=True)
class _Feed:
    """A forward's rows in the cache: each row's slot and position, and for the eager path the flat
    cache rows they are written to (`_cache_rows`) and each RoPE kind's tables at those positions."""

    slots: torch.Tensor
    pos: torch.Tensor
    where: torch.Tensor | None
    rope: dict[str | None, tuple[torch.Tensor, torch.Tensor]] | None


class SlotCacheRunner:
    """The fast path: Llama-family layers over a packed slot KV cache (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, max_slots: int, max_seq_len: int) -> None:
        """Raises `UnsupportedArchitectureError` (naming what is missing) for a model off the fast path."""
        config: Any = model.config if hasattr(model, "config") else None
        self.arch = describe(model)
        self.model: Any = model
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.windows = self.arch.windows
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._k = torch.empty(0, device=self.device, dtype=self.dtype)
        self._v = torch.empty(0, device=self.device, dtype=self.dtype)
        self._slot_cap = 0
        self._len_cap = 0
        self._arange = torch.arange(max_seq_len, device=self.device)
        self._bucket_key: tuple[int, ...] = ()
        self._bucket_overhead = _BUCKET_OVERHEAD.get(self.device.type, _BUCKET_OVERHEAD_ACCELERATOR)
        self._bucket_plan: list[tuple[int, int, int]] = []
        self._tokens: dict[int, list[int]] = {}  # slot -> the tokens whose KV it holds
        self._shared: int | None = None  # cached positions every running slot shares (None: unknown)
        self._deferred = DeferredCopies()  # prefix copies recorded, made only when needed
        self._prefix_panels = PrefixPanels()  # cascade decode's shared prefix, packed once
        self._adapters: dict[str, list[_LayerLora]] = {}
        self._groups: _Groups = []
        self._group_key: tuple[str | None, ...] = ()
        self._decode_groups: _Groups = []
        names = {id(m): name for name, m in model.named_modules()}
        self._paths: dict[str, tuple[int, str]] = {}  # module path -> (layer, projection)
        inner: Any = self.model.model
        decoder_layers: list[Any] = list(inner.layers)
        self.act = decoder_layers[0].mlp.act_fn
        for index, layer in enumerate(decoder_layers):
            attn, mlp = layer.self_attn, layer.mlp
            for proj, module in (
                ("q", attn.q_proj),
                ("k", attn.k_proj),
                ("v", attn.v_proj),
                ("o", attn.o_proj),
                ("gate", mlp.gate_proj),
                ("up", mlp.up_proj),
                ("down", mlp.down_proj),
            ):
                self._paths[names[id(module)]] = (index, proj)
        self.lora_modules = frozenset(self._paths)
        # The fused CPU kernels (engine.fused) for float32 on the CPU; the eager path elsewhere.
        probe = next(model.parameters())
        self._fused: Any = fused_kernels() if fused_usable(probe) else None
        with torch.no_grad():  # transformers has its own SiLU classes: recognised by what they compute
            grid = torch.linspace(-6.0, 6.0, 25)
            self._silu = bool(torch.equal(self.act(grid), F.silu(grid)))
        self.refresh_weights()

    def refresh_weights(self) -> None:
        inner: Any = self.model.model
        heads, kv = self.num_heads, self.num_kv_heads
        self.layers = [_Layer(layer, self.arch, heads, kv) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight.detach()
        self.embed_scale = torch.tensor(self.arch.embed_scale, dtype=self.dtype, device=self.device)
        self.norm_w = _norm_weight(inner.norm, self.arch.norm_offset)
        self.norm_eps = norm_eps(inner.norm)
        head: Any = self.model.lm_head
        self.head_w = pack_weight(head.weight)
        self.head_b = None if head.bias is None else head.bias.detach()
        # The model's own rotary module, so every RoPE variant and its scaling come out exactly as in HF
        # (Gemma 3: one table per layer type, local and global layers rotate with different bases).
        self.rope: dict[str | None, tuple[torch.Tensor, torch.Tensor]] = {}
        half = self.head_dim // 2
        with torch.no_grad():
            positions = self._arange[None, :]
            probe = torch.empty(1, device=self.device, dtype=self.dtype)
            for kind in dict.fromkeys(self.arch.rope_kinds):
                cos, sin = (
                    inner.rotary_emb(probe, positions)
                    if kind is None
                    else inner.rotary_emb(probe, positions, kind)
                )
                self.rope[kind] = (cos[0], torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1))
        self._shared = None  # the cached KV is the old weights' (the engine drops it), never shared again
        self._prefix_panels.clear()

    def reserve(self, slots: int, length: int) -> None:
        self._ensure_capacity(slots, length, exact=True)

    def release_cache(self) -> None:
        self._k = torch.empty(0, device=self.device, dtype=self.dtype)
        self._v = torch.empty(0, device=self.device, dtype=self.dtype)
        self._slot_cap = self._len_cap = 0
        self._tokens.clear()
        self._deferred.clear()
        self._prefix_panels.clear()
        self._shared = None

    def slot_capacity(self) -> int:
        return self._slot_cap

    def set_adapters(self, adapters: Mapping[str, Adapter]) -> None:
        built: dict[str, list[_LayerLora]] = {}
        for name, adapter in adapters.items():
            parts: list[dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]] = [{} for _ in self.layers]
            for path, delta in adapter.items():
                index, proj = self._paths[path]
                fused, place = _FUSED[proj]
                a = delta.a.to(self.device, self.dtype)
                b = (delta.b.to(self.device, torch.float32) * delta.scale).to(self.dtype)
                parts[index].setdefault(fused, {})[place] = (a, b)
            built[name] = [self._layer_lora(index, found) for index, found in enumerate(parts)]
        self._adapters = built
        self._group_key = ()

    def _layer_lora(
        self, index: int, found: dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]
    ) -> _LayerLora:
        layer = self.layers[index]
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        inter = out_features(layer.gate_up_w) // 2
        outs = {"qkv": [h * d, kv * d, kv * d], "o": [out_features(layer.o_w)], "gate_up": [inter, inter]}
        outs["down"] = [out_features(layer.down_w)]
        fused: dict[str, tuple[torch.Tensor, torch.Tensor] | None] = {}
        for kind, sizes in outs.items():
            pieces = found.get(kind)
            if not pieces:
                fused[kind] = None
                continue
            a = torch.cat([pieces[p][0] for p in sorted(pieces)])
            b = torch.zeros(sum(sizes), a.shape[0], device=self.device, dtype=self.dtype)
            col = 0
            for place in sorted(pieces):
                piece = pieces[place][1]
                row = sum(sizes[:place])
                b[row : row + piece.shape[0], col : col + piece.shape[1]] = piece
                col += piece.shape[1]
            fused[kind] = (a, b)
        return _LayerLora(fused["qkv"], fused["o"], fused["gate_up"], fused["down"])

    def _row_groups(self, adapters: list[str | None] | None, counts: list[int] | None = None) -> _Groups:
        """The rows of each adapter in this forward (`counts[i]` rows for entry i, one each by
        default); rows with no adapter, or one this runner does not hold, are in no group."""
        if not adapters or not self._adapters:
            return []
        rows: dict[str, list[int]] = {}
        start = 0
        for i, name in enumerate(adapters):
            n = counts[i] if counts is not None else 1
            if name is not None and name in self._adapters:
                rows.setdefault(name, []).extend(range(start, start + n))
            start += n
        return [
            (self._adapters[name], None if len(r) == start else torch.tensor(r, device=self.device))
            for name, r in rows.items()
        ]

    def _linear(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        index: int,
        kind: str,
    ) -> torch.Tensor:
        """`x @ weight.T + bias` (`weight` plain or packed, `engine.linear`) plus each adapter's delta on its
        own rows."""
        y = linear(x, weight, bias)
        for layers, rows in self._groups:
            ab: tuple[torch.Tensor, torch.Tensor] | None = getattr(layers[index], kind)
            if ab is None:
                continue
            a, b = ab
            if rows is None:
                y.add_(F.linear(F.linear(x, a), b))
            else:
                y.index_add_(0, rows, F.linear(F.linear(x.index_select(0, rows), a), b))
        return y

    def _ensure_capacity(self, slots: int, length: int, *, exact: bool = False) -> None:
        """Grow the cache to hold `slots` x `length`: by doubling when a step outgrows it, or to the
        next multiple of 64 positions when the engine reserves what its admitted requests need."""
        if slots <= self._slot_cap and length <= self._len_cap:
            return
        new_slots = min(self.max_slots, max(self._slot_cap, _next_pow2(slots)))
        grown = -(-length // 64) * 64 if exact else _next_pow2(max(length, 64))
        new_len = min(self.max_seq_len, max(self._len_cap, grown))
        shape = (len(self.layers), new_slots, self.num_kv_heads, new_len, self.head_dim)
        k = zeroed(shape, self.device, self.dtype)
        v = zeroed(shape, self.device, self.dtype)
        if self._slot_cap:
            k[:, : self._slot_cap, :, : self._len_cap] = self._k
            v[:, : self._slot_cap, :, : self._len_cap] = self._v
        self._k, self._v = k, v
        self._slot_cap, self._len_cap = new_slots, new_len

    def _embed(self, ids: list[int]) -> torch.Tensor:
        x = F.embedding(torch.tensor(ids, dtype=torch.long, device=self.device), self.embed)
        return x * self.embed_scale if self.arch.embed_scale != 1.0 else x

    def _after_attention(
        self, index: int, layer: _Layer, x: torch.Tensor, attn: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The rest of a decoder layer after attention: output projection, residual, MLP, residual (with
        a sandwich-norm family's norms on both outputs). Returns the residual stream and its
        normalised form for the next layer (or the LM head)."""
        out = self._linear(attn, layer.o_w, layer.o_b, index, "o")
        fused = self._fused
        x, h = _add_norm(fused, x, out, layer.ln2_w, layer.eps, layer.post_attn_w, layer.eps)
        gate_up = self._linear(h, layer.gate_up_w, layer.gate_up_b, index, "gate_up")
        if fused is not None and self._silu:
            act = fused.silu_mul(gate_up)
        else:
            gate, up = gate_up.chunk(2, dim=-1)
            act = self.act(gate) * up
        out = self._linear(act, layer.down_w, layer.down_b, index, "down")
        # The norm that reads this output: the next layer's input norm, or the final one.
        following = self.layers[index + 1] if index + 1 < len(self.layers) else None
        weight, eps = (
            (following.ln1_w, following.eps) if following is not None else (self.norm_w, self.norm_eps)
        )
        return _add_norm(fused, x, out, weight, eps, layer.post_mlp_w, layer.eps)

    def _feed(self, slots: torch.Tensor, pos: torch.Tensor) -> _Feed:
        """Where a forward's rows go in the cache (slot and position each), in the form the path
        that writes them needs."""
        if self._fused is not None:
            return _Feed(slots, pos, None, None)
        where = _cache_rows(slots, pos, self.num_kv_heads, self._len_cap)
        return _Feed(slots, pos, where, _rope_at(self.rope, pos))

    def _queries(self, index: int, layer: _Layer, hidden: torch.Tensor, feed: _Feed) -> torch.Tensor:
        """The layer's queries `[rows, heads, head_dim]`, normalised per head where the family does and
        rotated; its keys (treated the same) and values are written to the cache at the feed's rows."""
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self._linear(hidden, layer.qkv_w, layer.qkv_b, index, "qkv")
        kind = self.arch.rope_kinds[index]
        if self._fused is not None:
            cos, sin = self.rope[kind]
            return self._fused.rope_store(
                qkv,
                h,
                cos,
                sin,
                feed.slots,
                feed.pos,
                self._k[index],
                self._v[index],
                layer.qk_norm_w,
                layer.qk_eps,
            )
        assert feed.where is not None and feed.rope is not None
        rows = qkv.shape[0]
        qk = qkv[:, : (h + kv) * d].view(rows, h + kv, d)
        if layer.qk_norm_w is not None:
            qk = F.rms_norm(qk, (d,), None, layer.qk_eps) * layer.qk_norm_w
        cos, sin = feed.rope[kind]
        # rotate_half(x) * sin == roll(x, d/2) * sin_signed, with the sign folded into the table.
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
        _store_kv(
            self._k[index], self._v[index], feed.where, qk[:, h:], qkv[:, (h + kv) * d :].view(rows, kv, d)
        )
        return qk[:, :h]

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on the final norm's output."""
        logits = linear(hidden, self.head_w, self.head_b)
        cap = self.arch.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits.float()

    @torch.inference_mode()
    def prefill(
        self,
        first_slot: int,
        prompts: list[list[int]],
        cached: list[int] | None = None,
        adapters: list[str | None] | None = None,
    ) -> torch.Tensor:
        """Packed ("varlen") prefill: the uncached tokens of every prompt run as one `[tokens, hidden]`
        batch through the matmuls, so no FLOP is spent on padding (prompts of mixed lengths padded to
        the longest cost up to twice the work); only attention runs per prompt."""
        m = len(prompts)
        starts = cached or [0] * m
        lens = [len(p) - c for p, c in zip(prompts, starts, strict=True)]
        self._groups = self._row_groups(adapters, lens)
        self._ensure_capacity(first_slot + m, max(len(p) for p in prompts))
        writes = {first_slot + i: c for i, c in enumerate(starts)}
        for i, prompt in enumerate(prompts):
            self._tokens[first_slot + i] = list(prompt)
        self._shared = None
        self._prefix_panels.written(writes)
        positions = [c + j for c, n in zip(starts, lens, strict=True) for j in range(n)]
        pos = torch.tensor(positions, device=self.device)
        slot_of = [first_slot + i for i, n in enumerate(lens) for _ in range(n)]
        feed = self._feed(torch.tensor(slot_of, device=self.device), pos)
        x = self._embed([t for p, c in zip(prompts, starts, strict=True) for t in p[c:]])
        hidden = _input_norm(self.layers[0], x)
        fused = self._fused
        shared = _prefill_shared(prompts, starts, adapters) if fused is not None else 0
        cascade = shared >= _CASCADE_MIN_SHARED
        padded = not cascade and _pads_cheaply(starts, lens)
        windows = dict.fromkeys(self.windows)
        arange = self._arange
        batch_masks = {w: padded_mask(arange, starts, lens, w) for w in windows} if padded else {}
        per_prompt = not (cascade or padded)
        reads = range(first_slot, first_slot + m)
        prefix_slot = _settle(
            self._deferred, self._k, self._v, writes, reads, shared if cascade else 0, first_slot
        )
        starts_t = torch.tensor(starts) if cascade else None  # the cascade kernel's prompt layout
        lens_t = torch.tensor(lens) if cascade else None
        prompt_masks = {w: per_prompt_masks(arange, starts, lens, w) for w in windows} if per_prompt else {}
        last = torch.tensor(list(itertools.accumulate(lens)), device=self.device) - 1
        final = len(self.layers) - 1
        for index, layer in enumerate(self.layers):
            q = self._queries(index, layer, hidden, feed)
            window = self.windows[index]
            if cascade:
                attn = fused.cascade_prefill(
                    q, self._k[index], self._v[index], first_slot, starts_t, lens_t, shared, window or 0,
                    self.arch.attn_scale, prefix_slot,
                )  # fmt: skip
            elif padded:
                mask = batch_masks[window]
                attn = self._padded_attention(index, first_slot, q, starts, lens, mask)
            else:
                masks = prompt_masks[window]
                attn = self._attention_per_prompt(index, first_slot, q, starts, lens, masks)
            attn = attn.reshape(len(positions), -1)
            if index == final:
                # Only each prompt's last position reaches the LM head, and the last layer's keys and
                # values are cached above: its output projection and MLP run on those rows alone.
                x, attn = x[last], attn[last]
                self._groups = self._row_groups(adapters)
            x, hidden = self._after_attention(index, layer, x, attn)
        return self._logits(hidden)

    def _attention_per_prompt(
        self,
        index: int,
        first_slot: int,
        q: torch.Tensor,
        starts: list[int],
        lens: list[int],
        masks: list[torch.Tensor | None],
    ) -> torch.Tensor:
        """Prefill attention one prompt at a time (`q` packed `[tokens, heads, head_dim]`): no padding,
        one attention call per prompt; for batches whose lengths differ widely."""
        gqa = self.num_kv_heads != self.num_heads
        attn = torch.empty_like(q)
        offset = 0
        for i, (c, n) in enumerate(zip(starts, lens, strict=True)):
            out = F.scaled_dot_product_attention(
                q[offset : offset + n].transpose(0, 1)[None],
                self._k[index, first_slot + i, :, : c + n][None],
                self._v[index, first_slot + i, :, : c + n][None],
                attn_mask=masks[i],
                is_causal=masks[i] is None,
                enable_gqa=gqa,
                scale=self.arch.attn_scale,
            )
            attn[offset : offset + n] = out[0].transpose(0, 1)
            offset += n
        return attn

    def _padded_attention(
        self,
        index: int,
        first_slot: int,
        q: torch.Tensor,
        starts: list[int],
        lens: list[int],
        mask: torch.Tensor,
    ) -> torch.Tensor:
        """Prefill attention for every prompt in one call: queries padded to the longest prompt, keys
        read from the prompts' slots up to the longest cached + new length, a mask per prompt. One call
        instead of one per prompt: with many short prompts (a group of rollouts of one task, mostly
        cached) the calls dominated."""
        m, width = len(lens), max(lens)
        span = mask.shape[-1]
        heads, dim = q.shape[1], q.shape[2]
        where = torch.tensor([i * width + j for i, n in enumerate(lens) for j in range(n)]).to(self.device)
        padded = q.new_zeros(m * width, heads, dim).index_copy_(0, where, q)
        out = F.scaled_dot_product_attention(
            padded.view(m, width, heads, dim).transpose(1, 2),
            self._k[index, first_slot : first_slot + m, :, :span],
            self._v[index, first_slot : first_slot + m, :, :span],
            attn_mask=mask,
            enable_gqa=self.num_kv_heads != self.num_heads,
            scale=self.arch.attn_scale,
        )
        return out.transpose(1, 2).reshape(m * width, heads, dim).index_select(0, where)

    def _buckets(self, positions: list[int]) -> list[tuple[int, int, int]]:
        """Split slots `0..n-1` into contiguous runs `(start, end, span)` that each attend over their
        own longest prefix instead of the batch's: a decode step is bound by reading the KV cache, and
        one long sequence would otherwise make every short one read its whole length. Chosen by dynamic
        programming over (keys read + a per-call overhead); recomputed only when the batch changes
        (between two plain decode steps every position moves by one)."""
        shifted = tuple(p - 1 for p in positions)
        if shifted == self._bucket_key:
            self._bucket_key = tuple(positions)
            self._bucket_plan = [(a, b, span + 1) for a, b, span in self._bucket_plan]
            return self._bucket_plan
        n = len(positions)
        longest_all = max(positions) + 1
        if n * longest_all - sum(positions) - n <= self._bucket_overhead:  # nothing worth a second call
            self._bucket_key, self._bucket_plan = tuple(positions), [(0, n, longest_all)]
            return self._bucket_plan
        best = [0] * (n + 1)
        cut = [0] * (n + 1)
        for end in range(1, n + 1):
            longest, best_cost = 0, -1
            for start in range(end - 1, -1, -1):
                longest = max(longest, positions[start] + 1)
                cost = best[start] + (end - start) * longest + self._bucket_overhead
                if best_cost < 0 or cost < best_cost:
                    best_cost, cut[end] = cost, start
            best[end] = best_cost
        plan: list[tuple[int, int, int]] = []
        end = n
        while end:
            start = cut[end]
            plan.append((start, end, max(positions[start:end]) + 1))
            end = start
        self._bucket_key = tuple(positions)
        self._bucket_plan = plan[::-1]
        return self._bucket_plan

    def _shared_prefix(self, n: int, adapters: list[str | None] | None) -> int:
        """How many leading cached positions every slot `0..n-1` holds the same tokens at (with one
        adapter for all: another adapter's KV of the same tokens differs). Worked out when the batch
        changes; decode steps only append, so it stays a common prefix until then."""
        if not _one_adapter(adapters):
            return 0
        if self._shared is None:
            seqs = [self._tokens.get(slot, []) for slot in range(n)]
            self._shared = _shared_by_all(seqs, len(seqs[0]) if seqs else 0)
        return self._shared

    def _track(self, feeds: list[list[int]], positions: list[int]) -> None:
        """Record each slot's fed tokens (a slot whose history is unknown stops growing, so what it
        records is still true). Positions a slot held past where it is fed now (rejected drafts) are
        forgotten; a common prefix that ends before them stays common."""
        for slot, (fed, position) in enumerate(zip(feeds, positions, strict=True)):
            seen = self._tokens.setdefault(slot, [])
            if len(seen) > position:
                del seen[position:]
                if self._shared is not None and position < self._shared:
                    self._shared = None
            if len(seen) == position:
                seen.extend(fed)

    @torch.inference_mode()
    def decode(
        self, tokens: list[int], positions: list[int], adapters: list[str | None] | None = None
    ) -> torch.Tensor:
        n = len(tokens)
        key = tuple(adapters) if adapters else ()
        if key != self._group_key:  # the batch's adapters change only when its sequences do
            self._group_key, self._decode_groups = key, self._row_groups(adapters)
        self._groups = self._decode_groups
        self._ensure_capacity(n, max(positions) + 1)
        self._track([[t] for t in tokens], positions)
        pos = torch.tensor(positions, device=self.device)
        feed = self._feed(torch.arange(n, device=self.device), pos)
        x = self._embed(tokens)
        hidden = _input_norm(self.layers[0], x)
        h, kv = self.num_heads, self.num_kv_heads
        gqa = kv != h
        span = max(positions) + 1
        shared = min(self._shared_prefix(n, adapters), span - 1) if n > 1 else 0
        cascade = shared >= _CASCADE_MIN_SHARED
        writes = dict(enumerate(positions))
        self._prefix_panels.written(writes)  # (a decode step writes past any prefix: kept as a rule)
        prefix_slot = _settle(self._deferred, self._k, self._v, writes, range(n), shared if cascade else 0, 0)
        windows = dict.fromkeys(self.windows)
        fused = self._fused
        biases: dict[int | None, torch.Tensor] = {}
        plan: dict[int | None, list[tuple[int, int, int, torch.Tensor]]] = {}
        if cascade and fused is None:
            biases = {w: additive(visible(self._arange[:span], pos, w))[:, None, None] for w in windows}
        elif not cascade:  # the fused cascade needs neither: it masks by position itself
            plan = {
                w: [
                    (a, b, s, visible(self._arange[:s], pos[a:b], w)[:, None, None])
                    for a, b, s in self._buckets(positions)
                ]
                for w in windows
            }
        for index, layer in enumerate(self.layers):
            q = self._queries(index, layer, hidden, feed)
            k_cache, v_cache = self._k[index], self._v[index]
            window = self.windows[index]
            if cascade and fused is not None:
                panels = self._prefix_panels.get(index, k_cache, v_cache, prefix_slot, shared)
                attn = fused.cascade_decode(
                    q, k_cache, v_cache, shared, pos, window or 0, self.arch.attn_scale, prefix_slot, *panels
                )
            elif cascade:
                attn = cascade_decode(
                    q, k_cache, v_cache, shared, span, biases[window], self.arch.attn_scale, prefix_slot
                )
            else:
                q = q[:, :, None]
                attn = torch.empty(n, h, 1, self.head_dim, device=self.device, dtype=self.dtype)
                for a, b, s, mask in plan[window]:
                    attn[a:b] = F.scaled_dot_product_attention(
                        q[a:b],
                        k_cache[a:b, :, :s],
                        v_cache[a:b, :, :s],
                        attn_mask=mask,
                        enable_gqa=gqa,
                        scale=self.arch.attn_scale,
                    )
            x, hidden = self._after_attention(index, layer, x, attn.reshape(n, -1))
        return self._logits(hidden)

    @torch.inference_mode()
    def verify(
        self, feeds: list[list[int]], positions: list[int], adapters: list[str | None] | None = None
    ) -> torch.Tensor:
        """A decode step with several queries per slot: the rows of all slots are packed for the
        matmuls (one pass over the weights for every token fed) and attention pads each slot's
        queries to the longest feed, reading a shared prefix once (cascade) as `decode` does."""
        if all(len(fed) == 1 for fed in feeds):
            return self.decode([fed[0] for fed in feeds], positions, adapters)
        n = len(feeds)
        lens = [len(fed) for fed in feeds]
        self._groups = self._row_groups(adapters, lens)
        span = max(p + m for p, m in zip(positions, lens, strict=True))
        self._ensure_capacity(n, span)
        self._track(feeds, positions)
        writes = dict(enumerate(positions))
        self._prefix_panels.written(writes)
        flat = [p + j for p, m in zip(positions, lens, strict=True) for j in range(m)]
        pos = torch.tensor(flat, device=self.device)
        slot_of = torch.tensor([i for i, m in enumerate(lens) for _ in range(m)], device=self.device)
        feed = self._feed(slot_of, pos)
        x = self._embed([t for fed in feeds for t in fed])
        hidden = _input_norm(self.layers[0], x)
        h, width = self.num_heads, max(lens)
        shared = min(self._shared_prefix(n, adapters), span - 1) if n > 1 else 0
        cascade = shared >= _CASCADE_MIN_SHARED
        prefix_slot = _settle(self._deferred, self._k, self._v, writes, range(n), shared if cascade else 0, 0)
        windows = dict.fromkeys(self.windows)
        arange = self._arange
        masks = {w: padded_mask(arange, positions, lens, w) for w in windows}
        if cascade:
            biases = {w: additive(mask[:, 0]) for w, mask in masks.items()}
            pad = torch.tensor(
                [i * width + j for i, m in enumerate(lens) for j in range(m)], device=self.device
            )
        for index, layer in enumerate(self.layers):
            queries = self._queries(index, layer, hidden, feed)
            k_cache, v_cache = self._k[index], self._v[index]
            window = self.windows[index]
            if cascade:
                q = queries.new_zeros(n * width, h, self.head_dim).index_copy_(0, pad, queries)
                out = cascade_attention(
                    q.view(n, width, h, -1),
                    k_cache,
                    v_cache,
                    shared,
                    span,
                    biases[window],
                    self.arch.attn_scale,
                    prefix_slot,
                )
                attn = out.reshape(n * width, h, -1).index_select(0, pad)
            else:
                attn = self._padded_attention(index, 0, queries, positions, lens, masks[window])
            x, hidden = self._after_attention(index, layer, x, attn.reshape(len(flat), -1))
        return self._logits(hidden)

    def move(self, src: int, dst: int, length: int) -> None:
        self.move_many([(src, dst, length)])
        self._tokens[dst] = self._tokens.get(src, [])[:length]
        self._shared = None

    @torch.inference_mode()
    def move_many(self, moves: list[tuple[int, int, int]]) -> None:
        moves = [m for m in moves if m[2]]
        if not moves:
            return
        self._ensure_capacity(max(max(s, d) for s, d, _ in moves) + 1, max(n for _, _, n in moves))
        # Most copies are only recorded (`DeferredCopies`: attention that reads a shared prefix once
        # never reads them); the rest go slot to slot in place. A gathered copy (`k[:, targets] =
        # k[:, sources]`) would stage every moved cache in a fresh buffer first (docs/engine.md,
        # "Moving caches"): only a source that this call also writes is read from a copy of its own.
        self._prefix_panels.written({dst: 0 for _, dst, _ in moves})
        before, now, after = self._deferred.plan_moves(moves)
        _copy_ranges(self._k, self._v, before)
        longest: dict[int, int] = {}
        for src, _, n in now:
            longest[src] = max(n, longest.get(src, 0))
        staged = {
            src: (self._k[:, src, :, :n].clone(), self._v[:, src, :, :n].clone())
            for src, n in longest.items()
        }
        for src, dst, n in now:
            k_src, v_src = staged[src]
            self._k[:, dst, :, :n] = k_src[:, :, :n]
            self._v[:, dst, :, :n] = v_src[:, :, :n]
        _copy_ranges(self._k, self._v, after)
        copies = [(dst, self._tokens.get(src, [])[:n]) for src, dst, n in moves]
        for dst, copied in copies:
            self._tokens[dst] = copied
        self._shared = None


class RecomputeRunner:
    """Exact for any causal LM: each step reruns every sequence in full, left-padded (no KV cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._seqs: dict[int, list[int]] = {}

    def refresh_weights(self) -> None:
        """Nothing is cached from the weights: the model is called directly."""

    def reserve(self, slots: int, length: int) -> None:
        """Nothing to reserve: this runner keeps token lists, not a KV cache."""

    lora_modules: frozenset[str] = frozenset()
    """None: adapters are served on the fast path only (the engine refuses them here)."""

    def release_cache(self) -> None:
        self._seqs.clear()

    def slot_capacity(self) -> int:
        """0: every step recomputes from the tokens, so a finished sequence's state saves nothing."""
        return 0

    def set_adapters(self, adapters: Mapping[str, Adapter]) -> None:
        if adapters:
            raise ValueError("the recompute runner serves no LoRA adapters")

    def _last_logits(self, seqs: list[list[int]]) -> torch.Tensor:
        return self._end_logits(seqs, [1] * len(seqs))

    @torch.inference_mode()
    def _end_logits(self, seqs: list[list[int]], counts: list[int]) -> torch.Tensor:
        """The logits at the last `counts[i]` positions of each sequence, row by row."""
        width = max(len(s) for s in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long)
        mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            position_ids=position_ids.to(self.device),
            use_cache=False,
        )
        return torch.cat([out.logits[i, width - c :] for i, c in enumerate(counts)]).float()

    def prefill(
        self,
        first_slot: int,
        prompts: list[list[int]],
        cached: list[int] | None = None,
        adapters: list[str | None] | None = None,
    ) -> torch.Tensor:
        for i, p in enumerate(prompts):
            self._seqs[first_slot + i] = list(p)
        return self._last_logits(prompts)

    def decode(
        self, tokens: list[int], positions: list[int], adapters: list[str | None] | None = None
    ) -> torch.Tensor:
        return self.verify([[t] for t in tokens], positions, adapters)

    def verify(
        self, feeds: list[list[int]], positions: list[int], adapters: list[str | None] | None = None
    ) -> torch.Tensor:
        for slot, (fed, position) in enumerate(zip(feeds, positions, strict=True)):
            self._seqs[slot][position:] = fed
        seqs = [self._seqs[slot] for slot in range(len(feeds))]
        return self._end_logits(seqs, [len(fed) for fed in feeds])

    def move(self, src: int, dst: int, length: int) -> None:
        self._seqs[dst] = self._seqs[src][:length]

    def move_many(self, moves: list[tuple[int, int, int]]) -> None:
        copies = [(dst, self._seqs[src][:length]) for src, dst, length in moves]
        for dst, tokens in copies:
            self._seqs[dst] = tokens


def _add_norm(
    fused: Any,
    x: torch.Tensor,
    y: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    post_w: torch.Tensor | None,
    post_eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The residual stream after a sublayer, `x + y` (`y` normalised first in a sandwich-norm family),
    and that sum normalised for what reads it next; one call of the fused kernel where there is one."""
    if fused is not None:
        return fused.add_rms_norm(x, y, weight, eps, post_w, post_eps)
    size = (x.shape[-1],)
    if post_w is not None:
        y = F.rms_norm(y, size, post_w, post_eps)
    x = x + y
    return x, F.rms_norm(x, size, weight, eps)


def _input_norm(first: _Layer, x: torch.Tensor) -> torch.Tensor:
    """The first layer's normalised input; later layers' come out of `_after_attention`."""
    return F.rms_norm(x, (x.shape[-1],), first.ln1_w, first.eps)


def _prefill_shared(prompts: list[list[int]], starts: list[int], adapters: list[str | None] | None) -> int:
    """How many leading cached positions every prompt of a prefill holds the same tokens at (with one
    adapter for all): prefix reuse copied them into each prompt's slot, so attention can read them
    once for all (`cascade_prefill`). 0 for a lone prompt."""
    if len(prompts) < 2 or not _one_adapter(adapters):
        return 0
    return _shared_by_all(prompts, min(starts))


def _one_adapter(adapters: list[str | None] | None) -> bool:
    """Whether every row runs with the same adapter (or none): another adapter's keys and values of the
    same tokens differ, so only then can a common prefix be read once for all."""
    return not adapters or len(set(adapters)) == 1


def _shared_by_all(seqs: list[list[int]], limit: int) -> int:
    """The length of the prefix all of `seqs` start with, at most `limit`."""
    shared = limit
    for seq in seqs[1:]:
        shared = common_prefix(seqs[0], seq, shared)
    return shared


def _settle(
    deferred: DeferredCopies,
    k: torch.Tensor,
    v: torch.Tensor,
    writes: Mapping[int, int],
    reads: range,
    keep: int,
    prefix_of: int,
) -> int:
    """Before a forward: the deferred copies its writes and its reads of its own slots from `keep` on
    need, made now (`DeferredCopies.settle`), and the slot to read `prefix_of`'s first `keep`
    positions from."""
    if not deferred:
        return prefix_of
    slot, copies = deferred.settle(writes, reads, keep, prefix_of)
    _copy_ranges(k, v, copies)
    return slot


def _copy_ranges(k: torch.Tensor, v: torch.Tensor, copies: list[RangeCopy]) -> None:
    """Make copies between slots of every layer's cache: `(from, to, first position, end)` each."""
    for src, dst, start, end in copies:
        k[:, dst, :, start:end] = k[:, src, :, start:end]
        v[:, dst, :, start:end] = v[:, src, :, start:end]


def _cache_rows(slots: torch.Tensor, pos: torch.Tensor, kv_heads: int, capacity: int) -> torch.Tensor:
    """Where each token's keys (one row per KV head) go in a layer's cache viewed as
    `[slots * kv_heads * capacity, head_dim]`: one `index_copy_` writes them all."""
    heads = torch.arange(kv_heads, device=slots.device)
    return ((slots[:, None] * kv_heads + heads) * capacity + pos[:, None]).reshape(-1)


def _store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, where: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write new keys and values into one layer's caches at the rows `where` (`_cache_rows`)."""
    head_dim = k_cache.shape[-1]
    k_cache.view(-1, head_dim).index_copy_(0, where, k.reshape(-1, head_dim))
    v_cache.view(-1, head_dim).index_copy_(0, where, v.reshape(-1, head_dim))


def _rope_at(
    rope: Mapping[str | None, tuple[torch.Tensor, torch.Tensor]], pos: torch.Tensor
) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
    """Each RoPE kind's cos and sin at `pos`, shaped to broadcast over heads."""
    return {kind: (cos[pos][:, None], sin[pos][:, None]) for kind, (cos, sin) in rope.items()}


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
