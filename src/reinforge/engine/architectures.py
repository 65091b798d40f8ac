"""What the engine's fast path must know about a model family beyond the Llama layout it is written for.

The families the fast path serves share one skeleton (embeddings, decoder layers of RMSNorm + attention
with RoPE + a gated MLP, a final norm and an LM head) and differ in a handful of places, which are read
once from the Hugging Face model into an `Architecture`:

- Qwen3 and Gemma 3 normalise each head's queries and keys (RMSNorm over the head dimension) before RoPE.
- Gemma's RMSNorm scales by `1 + w` (its weights are stored as offsets from one), its embeddings are
  multiplied by `sqrt(hidden)`, its layers also normalise the attention and MLP outputs ("sandwich"
  norms), and its attention scale is `query_pre_attn_scalar ** -0.5` instead of `head_dim ** -0.5`.
- Sliding-window layers (Gemma 3's five local layers per global one, Mistral, Qwen with
  `use_sliding_window`) see only the last `window` positions; Gemma 3's local and global layers use
  RoPE tables of different bases.
- Gemma 2-style attention soft-capping has no fused kernel, so it is refused by name rather than slowed.

A model the fast path cannot serve raises `UnsupportedArchitectureError` naming what is missing; the
engine then serves it with the exact (slow) recompute runner.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from reinforge.engine.errors import UnsupportedArchitectureError

FAST_FAMILIES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")
"""`config.model_type`s the fast path serves (`gemma3_text`: Gemma 3's text-only causal LM)."""

_GEMMA = frozenset({"gemma3_text"})
_LAYER_PARTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
    "mlp.act_fn",
    "input_layernorm",
    "post_attention_layernorm",
)
_GEMMA_PARTS = (
    "pre_feedforward_layernorm",
    "post_feedforward_layernorm",
    "self_attn.q_norm",
    "self_attn.k_norm",
)


@dataclass(frozen=True)
class Architecture:
    """One family's deviations from the Llama layout, per model (see the module docstring)."""

    family: str
    norm_offset: float
    """Added to every RMSNorm weight: 1.0 where the norm scales by `1 + w` (Gemma), else 0."""
    qk_norm: bool
    """Queries and keys are RMSNorm-ed per head before RoPE (Qwen3, Gemma 3)."""
    sandwich_norms: bool
    """The attention and MLP outputs are normalised before the residual add (Gemma 3)."""
    embed_scale: float
    """Embeddings are multiplied by this (Gemma: sqrt(hidden)); 1.0 elsewhere."""
    attn_scale: float
    """The softmax scale of attention scores."""
    windows: tuple[int | None, ...]
    """Per layer: the sliding window (a query at position p sees keys at positions > p - window), or
    None for global attention."""
    rope_kinds: tuple[str | None, ...]
    """Per layer: the rotary table it uses (Gemma 3's `layer_type`), None for the model's single one."""
    final_softcap: float | None
    """Logits are soft-capped as `cap * tanh(logits / cap)` (Gemma 2/3 option)."""


def describe(model: torch.nn.Module) -> Architecture:
    """Read `model`'s architecture, or raise `UnsupportedArchitectureError` naming what is missing."""
    config: Any = getattr(model, "config", None)
    family = getattr(config, "model_type", None)
    if config is None or family not in FAST_FAMILIES:
        raise UnsupportedArchitectureError(
            f"model type {family!r} is not on the engine's fast path (it serves {', '.join(FAST_FAMILIES)})"
        )
    inner: Any = getattr(model, "model", None)
    missing = [name for name in ("embed_tokens", "layers", "norm", "rotary_emb") if not hasattr(inner, name)]
    if not hasattr(model, "lm_head"):
        missing.append("lm_head")
    if missing:
        raise UnsupportedArchitectureError(
            f"{family} model lacks {', '.join(missing)} "
            "(the fast path reads model.model.<part> and model.lm_head)"
        )
    layers: list[Any] = list(inner.layers)
    gemma = family in _GEMMA
    for index, layer in enumerate(layers):
        absent = [p for p in (*_LAYER_PARTS, *(_GEMMA_PARTS if gemma else ())) if not _has_path(layer, p)]
        if family == "qwen3":
            absent += [p for p in ("self_attn.q_norm", "self_attn.k_norm") if not _has_path(layer, p)]
        if absent:
            raise UnsupportedArchitectureError(f"{family} layer {index} lacks {', '.join(absent)}")
    if getattr(config, "attn_logit_softcapping", None) is not None:
        raise UnsupportedArchitectureError(
            f"{family}: attention logit soft-capping (attn_logit_softcapping="
            f"{config.attn_logit_softcapping}) is not on the fast path"
        )
    if getattr(config, "use_bidirectional_attention", False):
        raise UnsupportedArchitectureError(f"{family}: bidirectional attention is not on the fast path")
    scales = {float(layer.self_attn.scaling) for layer in layers}
    if len(scales) != 1:
        raise UnsupportedArchitectureError(
            f"{family}: layers with different attention scales {sorted(scales)}"
        )
    per_type = hasattr(inner.rotary_emb, "layer_types")  # Gemma 3: one RoPE table per layer type
    kinds = tuple(config.layer_types[i] if per_type else None for i in range(len(layers)))
    embed_scale = float(getattr(inner.embed_tokens, "scalar_embed_scale", 1.0))
    return Architecture(
        family=family,
        norm_offset=1.0 if gemma else 0.0,
        qk_norm=_has_path(layers[0], "self_attn.q_norm"),
        sandwich_norms=gemma,
        embed_scale=embed_scale,
        attn_scale=scales.pop(),
        windows=tuple(_window(config, layer) for layer in layers),
        rope_kinds=kinds,
        final_softcap=getattr(config, "final_logit_softcapping", None),
    )


def _has_path(module: Any, path: str) -> bool:
    for part in path.split("."):
        module = getattr(module, part, None)
        if module is None:
            return False
    return True


def _window(config: Any, layer: Any) -> int | None:
    """A layer's sliding window: its attention module's own (Qwen, Gemma 3: None on global layers),
    else the config's (Mistral: every layer)."""
    attn = layer.self_attn
    own = hasattr(attn, "sliding_window")
    window = attn.sliding_window if own else getattr(config, "sliding_window", None)
    return None if window is None else int(window)


def norm_eps(norm: Any) -> float:
    """An RMSNorm module's epsilon (`variance_epsilon` in Llama/Qwen, `eps` in Gemma)."""
    eps = getattr(norm, "variance_epsilon", None)
    return float(eps if eps is not None else norm.eps)
