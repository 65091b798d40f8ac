"""Model runners: run a causal LM over per-sequence KV caches held in static slots.

Why static slots and not paged blocks: the engine's targets are small models on CPU and single GPUs
where sequences are short (hundreds to a few thousand tokens); a slot tensor
`[layers, slots, kv_heads, capacity, head_dim]` lets one decode step read every active sequence's cache
as a plain strided view (no gather, no block table), and keeping the active sequences packed in slots
`0..n-1` (a finished sequence's slot is refilled by moving the last one) makes that view `[:n]`.
Capacity grows by doubling along both axes, so memory follows the live batch, bounded by
`max_slots * max_seq_len`.

Two runners share one interface:
- `SlotCacheRunner`: the fast path for Llama-family models (llama, qwen2, mistral): it runs the
  model's own weights with fused q/k/v and gate/up projections, one forward per decode step for all
  active sequences.
- `RecomputeRunner`: any other causal LM transformers can build: exact but recomputes every sequence
  in full at each step (no cache), so it is only for correctness on architectures the fast path lacks.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.nn.functional as F
from transformers.activations import ACT2FN

FAST_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})


class ModelRunner(Protocol):
    """Computes next-token logits for sequences living in slots `0..n-1`."""

    def prefill(
        self, first_slot: int, prompts: list[list[int]], cached: list[int] | None = None
    ) -> torch.Tensor:
        """Fill slots `first_slot..first_slot+len(prompts)-1`; return float32 logits `[m, vocab]` at each
        prompt's last position. `cached[i]` leading positions of prompt i are already in its slot
        (copied from a sequence with the same prefix) and are not recomputed."""
        ...

    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Feed one token to each of slots `0..n-1` at its position; return float32 logits `[n, vocab]`."""
        ...

    def move(self, src: int, dst: int, length: int) -> None:
        """Copy the first `length` cached positions of slot `src` into slot `dst` (`src` is unchanged)."""
        ...

    def refresh_weights(self) -> None:
        """Re-read the model's parameters (after a weight update)."""
        ...


def make_runner(model: torch.nn.Module, max_slots: int, max_seq_len: int) -> ModelRunner:
    """The fast runner when the architecture is supported, the exact recompute runner otherwise."""
    if SlotCacheRunner.supports(model, max_seq_len):
        return SlotCacheRunner(model, max_slots, max_seq_len)
    return RecomputeRunner(model)


class _Layer:
    """One decoder layer's weights, with q/k/v and gate/up concatenated so each is one matmul."""

    def __init__(self, layer: Any) -> None:
        attn, mlp = layer.self_attn, layer.mlp
        self.qkv_w = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]).detach()
        biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
        self.qkv_b = torch.cat([b.detach() for b in biases]) if all(b is not None for b in biases) else None
        self.o_w = attn.o_proj.weight.detach()
        self.o_b = None if attn.o_proj.bias is None else attn.o_proj.bias.detach()
        self.gate_up_w = torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach()
        gate_b, up_b = mlp.gate_proj.bias, mlp.up_proj.bias
        self.gate_up_b = None if gate_b is None or up_b is None else torch.cat([gate_b, up_b]).detach()
        self.down_w = mlp.down_proj.weight.detach()
        self.down_b = None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach()
        self.ln1_w = layer.input_layernorm.weight.detach()
        self.ln1_eps = float(layer.input_layernorm.variance_epsilon)
        self.ln2_w = layer.post_attention_layernorm.weight.detach()
        self.ln2_eps = float(layer.post_attention_layernorm.variance_epsilon)


class SlotCacheRunner:
    """The fast path: Llama-family layers over a packed slot KV cache (see the module docstring)."""

    @staticmethod
    def supports(model: torch.nn.Module, max_seq_len: int) -> bool:
        config: Any = getattr(model, "config", None)
        if config is None or getattr(config, "model_type", None) not in FAST_MODEL_TYPES:
            return False
        # A sliding window changes which keys a query sees; the fast path attends to the whole prefix,
        # which is the same thing as long as no sequence outgrows the window.
        layer_types = getattr(config, "layer_types", None)
        if layer_types is not None:
            sliding = any(t != "full_attention" for t in layer_types)
        else:
            sliding = getattr(config, "sliding_window", None) is not None
        window = getattr(config, "sliding_window", None)
        return not sliding or (window is not None and window >= max_seq_len)

    def __init__(self, model: torch.nn.Module, max_slots: int, max_seq_len: int) -> None:
        config: Any = model.config
        self.model: Any = model
        self.max_slots = max_slots
        self.max_seq_len = max_seq_len
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(getattr(config, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.num_heads)
        self.act = ACT2FN[config.hidden_act]
        param = next(model.parameters())
        self.device, self.dtype = param.device, param.dtype
        self._k = torch.empty(0, device=self.device, dtype=self.dtype)
        self._v = torch.empty(0, device=self.device, dtype=self.dtype)
        self._slot_cap = 0
        self._len_cap = 0
        self._arange = torch.arange(max_seq_len, device=self.device)
        self.refresh_weights()

    def refresh_weights(self) -> None:
        inner: Any = self.model.model
        self.layers = [_Layer(layer) for layer in inner.layers]
        self.embed = inner.embed_tokens.weight.detach()
        self.norm_w = inner.norm.weight.detach()
        self.norm_eps = float(inner.norm.variance_epsilon)
        head: Any = self.model.lm_head
        self.head_w = head.weight.detach()
        self.head_b = None if head.bias is None else head.bias.detach()
        # The model's own rotary module, so every RoPE variant and its scaling come out exactly as in HF.
        with torch.no_grad():
            positions = self._arange[None, :]
            probe = torch.empty(1, device=self.device, dtype=self.dtype)
            cos, sin = inner.rotary_emb(probe, positions)
        half = self.head_dim // 2
        self.cos = cos[0]
        self.sin = torch.cat([-sin[0, :, :half], sin[0, :, half:]], dim=-1)

    def _ensure_capacity(self, slots: int, length: int) -> None:
        if slots <= self._slot_cap and length <= self._len_cap:
            return
        new_slots = min(self.max_slots, max(self._slot_cap, _next_pow2(slots)))
        new_len = min(self.max_seq_len, max(self._len_cap, _next_pow2(max(length, 64))))
        shape = (len(self.layers), new_slots, self.num_kv_heads, new_len, self.head_dim)
        k = torch.zeros(shape, device=self.device, dtype=self.dtype)
        v = torch.zeros(shape, device=self.device, dtype=self.dtype)
        if self._slot_cap:
            k[:, : self._slot_cap, :, : self._len_cap] = self._k
            v[:, : self._slot_cap, :, : self._len_cap] = self._v
        self._k, self._v = k, v
        self._slot_cap, self._len_cap = new_slots, new_len

    def _split_heads(
        self, qkv: torch.Tensor, batch: int, length: int, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k (both rotated in one pass over their shared slice of `qkv`) and v, as [b, heads, len, d]."""
        h, kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qk = qkv[..., : (h + kv) * d].reshape(batch, length, h + kv, d).transpose(1, 2)
        # rotate_half(x) * sin == roll(x, d/2) * sin_signed, with the sign folded into the table.
        qk = qk * cos + qk.roll(d // 2, dims=-1) * sin
        v = qkv[..., (h + kv) * d :].reshape(batch, length, kv, d).transpose(1, 2)
        return qk[:, :h], qk[:, h:], v

    def _mlp(self, layer: _Layer, x: torch.Tensor) -> torch.Tensor:
        h = F.rms_norm(x, (x.shape[-1],), layer.ln2_w, layer.ln2_eps)
        gate, up = F.linear(h, layer.gate_up_w, layer.gate_up_b).chunk(2, dim=-1)
        return x + F.linear(self.act(gate) * up, layer.down_w, layer.down_b)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = F.rms_norm(hidden, (hidden.shape[-1],), self.norm_w, self.norm_eps)
        return F.linear(hidden, self.head_w, self.head_b).float()

    @torch.inference_mode()
    def prefill(
        self, first_slot: int, prompts: list[list[int]], cached: list[int] | None = None
    ) -> torch.Tensor:
        if cached is not None and any(cached):
            return self._extend(first_slot, prompts, cached)
        m = len(prompts)
        lengths = [len(p) for p in prompts]
        padded_len = max(lengths)
        self._ensure_capacity(first_slot + m, padded_len)
        ids = torch.zeros(m, padded_len, dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, : len(p)] = torch.tensor(p, dtype=torch.long)
        x = F.embedding(ids.to(self.device), self.embed)
        cos, sin = self.cos[:padded_len], self.sin[:padded_len]
        gqa = self.num_kv_heads != self.num_heads
        slots = slice(first_slot, first_slot + m)
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1_w, layer.ln1_eps)
            q, k, v = self._split_heads(F.linear(h, layer.qkv_w, layer.qkv_b), m, padded_len, cos, sin)
            # Right padding + a causal mask: a real query never sees a padding key, and the padding
            # written to the cache lies beyond the sequence's length, where decode masks it out.
            self._k[index, slots, :, :padded_len] = k
            self._v[index, slots, :, :padded_len] = v
            attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
            attn = attn.transpose(1, 2).reshape(m, padded_len, -1)
            x = self._mlp(layer, x + F.linear(attn, layer.o_w, layer.o_b))
        last = torch.tensor([n - 1 for n in lengths], device=self.device)
        return self._logits(x[torch.arange(m, device=self.device), last])

    def _extend(self, first_slot: int, prompts: list[list[int]], cached: list[int]) -> torch.Tensor:
        """Prefill only the uncached tail of each prompt, attending to its cached prefix too."""
        m = len(prompts)
        tails = [p[c:] for p, c in zip(prompts, cached, strict=True)]
        width = max(len(t) for t in tails)
        span = max(len(p) for p in prompts)
        self._ensure_capacity(first_slot + m, span)
        ids = torch.zeros(m, width, dtype=torch.long)
        valid = torch.zeros(m, width, dtype=torch.bool)
        for i, t in enumerate(tails):
            ids[i, : len(t)] = torch.tensor(t, dtype=torch.long)
            valid[i, : len(t)] = True
        valid = valid.to(self.device)
        starts = torch.tensor(cached, device=self.device)
        # Padding positions are clamped inside the context; they are never written to the cache.
        pos = (starts[:, None] + self._arange[:width][None, :]).clamp(max=self.max_seq_len - 1)
        rows = torch.arange(first_slot, first_slot + m, device=self.device)[:, None].expand(m, width)[valid]
        cols = pos[valid]
        x = F.embedding(ids.to(self.device), self.embed)
        cos, sin = self.cos[pos][:, None], self.sin[pos][:, None]
        mask = (self._arange[:span][None, None, :] <= pos[:, :, None])[:, None]
        gqa = self.num_kv_heads != self.num_heads
        slots = slice(first_slot, first_slot + m)
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1_w, layer.ln1_eps)
            q, k, v = self._split_heads(F.linear(h, layer.qkv_w, layer.qkv_b), m, width, cos, sin)
            self._k[index, rows, :, cols] = k.transpose(1, 2)[valid]
            self._v[index, rows, :, cols] = v.transpose(1, 2)[valid]
            keys, values = self._k[index, slots, :, :span], self._v[index, slots, :, :span]
            attn = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
            attn = attn.transpose(1, 2).reshape(m, width, -1)
            x = self._mlp(layer, x + F.linear(attn, layer.o_w, layer.o_b))
        last = torch.tensor([len(t) - 1 for t in tails], device=self.device)
        return self._logits(x[torch.arange(m, device=self.device), last])

    @torch.inference_mode()
    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        n = len(tokens)
        span = max(positions) + 1
        self._ensure_capacity(n, span)
        pos = torch.tensor(positions, device=self.device)
        rows = torch.arange(n, device=self.device)
        x = F.embedding(torch.tensor(tokens, device=self.device), self.embed)[:, None, :]
        cos, sin = self.cos[pos][:, None, None, :], self.sin[pos][:, None, None, :]
        mask = (self._arange[:span][None, :] <= pos[:, None])[:, None, None, :]
        gqa = self.num_kv_heads != self.num_heads
        for index, layer in enumerate(self.layers):
            h = F.rms_norm(x, (x.shape[-1],), layer.ln1_w, layer.ln1_eps)
            q, k, v = self._split_heads(F.linear(h, layer.qkv_w, layer.qkv_b), n, 1, cos, sin)
            k_cache, v_cache = self._k[index], self._v[index]
            k_cache[rows, :, pos] = k[:, :, 0]
            v_cache[rows, :, pos] = v[:, :, 0]
            attn = F.scaled_dot_product_attention(
                q, k_cache[:n, :, :span], v_cache[:n, :, :span], attn_mask=mask, enable_gqa=gqa
            )
            x = self._mlp(layer, x + F.linear(attn.reshape(n, 1, -1), layer.o_w, layer.o_b))
        return self._logits(x[:, 0])

    @torch.inference_mode()
    def move(self, src: int, dst: int, length: int) -> None:
        if length:
            self._ensure_capacity(max(src, dst) + 1, length)
            self._k[:, dst, :, :length] = self._k[:, src, :, :length]
            self._v[:, dst, :, :length] = self._v[:, src, :, :length]


class RecomputeRunner:
    """Exact for any causal LM: each step reruns every sequence in full, left-padded (no KV cache)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.device = next(model.parameters()).device
        self._seqs: dict[int, list[int]] = {}

    def refresh_weights(self) -> None:
        """Nothing is cached from the weights: the model is called directly."""

    @torch.inference_mode()
    def _last_logits(self, seqs: list[list[int]]) -> torch.Tensor:
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
        return out.logits[:, -1].float()

    def prefill(
        self, first_slot: int, prompts: list[list[int]], cached: list[int] | None = None
    ) -> torch.Tensor:
        for i, p in enumerate(prompts):
            self._seqs[first_slot + i] = list(p)
        return self._last_logits(prompts)

    def decode(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        for slot, token in enumerate(tokens):
            self._seqs[slot].append(token)
        return self._last_logits([self._seqs[slot] for slot in range(len(tokens))])

    def move(self, src: int, dst: int, length: int) -> None:
        self._seqs[dst] = self._seqs[src][:length]


def _next_pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
