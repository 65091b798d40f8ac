"""Reading and checking weight updates, so a bad update fails the caller and never the serving loop."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file

from reinforge.errors import InvalidRequestError

WeightsSource = Mapping[str, torch.Tensor] | str | Path


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Load a state dict from a `save_pretrained` folder, a .safetensors file or a torch .pt/.bin file."""
    p = Path(path)
    if p.is_dir():
        for name in ("model.safetensors", "pytorch_model.bin"):
            if (p / name).is_file():
                return read_state_dict(p / name)
        index = p / "model.safetensors.index.json"
        if index.is_file():
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
            state: dict[str, torch.Tensor] = {}
            for shard in shards:
                state.update(load_file(str(p / shard), device="cpu"))
            return state
        raise InvalidRequestError(f"{p} holds no model.safetensors, sharded index or pytorch_model.bin")
    if not p.is_file():
        raise InvalidRequestError(f"weights path {p} does not exist")
    if p.suffix == ".safetensors":
        return load_file(str(p), device="cpu")
    loaded = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
        raise InvalidRequestError(f"{p} does not hold a state dict of tensors")
    return loaded


def check_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Reject unknown names and wrong shapes; names not given keep their current values."""
    own = model.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown:
        raise InvalidRequestError(
            f"weight update has {len(unknown)} names the model does not have, e.g. {unknown[:3]}"
        )
    wrong = [k for k, v in state.items() if tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        k = wrong[0]
        raise InvalidRequestError(
            f"weight update has wrong shapes for {len(wrong)} tensors, e.g. {k}: "
            f"{tuple(state[k].shape)} instead of {tuple(own[k].shape)}"
        )


@torch.no_grad()
def apply_state_dict(model: torch.nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy in place (tied weights share storage, so updating either name updates both)."""
    own = model.state_dict()
    for name, tensor in state.items():
        own[name].copy_(tensor)
