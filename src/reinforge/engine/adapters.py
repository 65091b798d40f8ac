"""Named LoRA adapters served on one base model, and how weight updates carry them.

A weight update is one flat state dict: the base model's own names, plus, for each adapter and each
adapted linear module, three tensors named

    lora/<adapter>/<module path>.lora_A   [r, in_features]
    lora/<adapter>/<module path>.lora_B   [out_features, r]
    lora/<adapter>/<module path>.scale    one number (peft's alpha / r)

where `<module path>` is the module's name in the base model (`model.layers.0.self_attn.q_proj`).
One flat mapping keeps every way of delivering weights working unchanged (a folder, a safetensors
file, the process engine's shared buffer). An update that names an adapter replaces that adapter
whole; adapters it does not name keep theirs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from reinforge.errors import InvalidRequestError

LORA_PREFIX = "lora/"
_PARTS = ("lora_A", "lora_B", "scale")


@dataclass(frozen=True)
class LoraDelta:
    """One adapted module: `y += scale * B (A x)`, with `scale` folded into `b` when served."""

    a: torch.Tensor
    """`[r, in_features]`."""
    b: torch.Tensor
    """`[out_features, r]`."""
    scale: float


Adapter = dict[str, LoraDelta]
"""An adapter's deltas by module path."""


def lora_key(adapter: str, module: str, part: str) -> str:
    """The weight name of one adapter tensor (`part`: "lora_A", "lora_B" or "scale")."""
    return f"{LORA_PREFIX}{adapter}/{module}.{part}"


def split_state(
    state: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, dict[str, dict[str, torch.Tensor]]]]:
    """(the base model's tensors, {adapter: {module path: {part: tensor}}})."""
    base: dict[str, torch.Tensor] = {}
    adapters: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    for name, tensor in state.items():
        if not name.startswith(LORA_PREFIX):
            base[name] = tensor
            continue
        adapter, sep, rest = name[len(LORA_PREFIX) :].partition("/")
        module, dot, part = rest.rpartition(".")
        if not (adapter and sep and module and dot and part in _PARTS):
            raise InvalidRequestError(
                f"adapter weight {name!r} is not named lora/<adapter>/<module path>.(lora_A|lora_B|scale)"
            )
        adapters.setdefault(adapter, {}).setdefault(module, {})[part] = tensor
    return base, adapters


def parse_adapters(
    model: torch.nn.Module,
    raw: Mapping[str, Mapping[str, Mapping[str, torch.Tensor]]],
    servable: frozenset[str],
) -> dict[str, Adapter]:
    """Check the adapter tensors of an update against the model (so a bad update fails its caller,
    never the serving loop): each module is a linear layer the runner can adapt, A is `[r, in]`,
    B is `[out, r]` with the same r, and the scale is one number. The tensors are not copied here."""
    modules = dict(model.named_modules())
    out: dict[str, Adapter] = {}
    for adapter, parts_by_module in raw.items():
        deltas: Adapter = {}
        for path, parts in parts_by_module.items():
            missing = [p for p in _PARTS if p not in parts]
            if missing:
                raise InvalidRequestError(f"adapter {adapter!r} module {path!r} lacks {missing}")
            module = modules.get(path)
            if not isinstance(module, torch.nn.Linear):
                raise InvalidRequestError(f"adapter {adapter!r}: {path!r} is not a linear layer of the model")
            if path not in servable:
                raise InvalidRequestError(
                    f"adapter {adapter!r}: this engine cannot apply an adapter to {path!r} "
                    f"({len(servable)} modules can be adapted)"
                )
            a, b, scale = parts["lora_A"], parts["lora_B"], parts["scale"]
            rank = a.shape[0] if a.dim() == 2 else -1
            if tuple(a.shape) != (rank, module.in_features) or tuple(b.shape) != (module.out_features, rank):
                raise InvalidRequestError(
                    f"adapter {adapter!r} module {path!r}: lora_A {tuple(a.shape)} and lora_B "
                    f"{tuple(b.shape)} do not fit [r, {module.in_features}] and [{module.out_features}, r]"
                )
            if scale.numel() != 1:
                raise InvalidRequestError(f"adapter {adapter!r} module {path!r}: scale must be one number")
            deltas[path] = LoraDelta(a, b, float(scale.reshape(())))
        out[adapter] = deltas
    return out
