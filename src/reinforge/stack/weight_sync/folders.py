"""Policy weights written as an inference server reads them: a Hugging Face safetensors folder, or
a peft LoRA adapter folder.

Every file is written under a temporary name and renamed into place, so a server never reads half a
file; other `*.safetensors` files in a full-weights folder are removed, since servers load every
safetensors file they find there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

WEIGHTS_FILE = "model.safetensors"


def write_full_weights(folder: Path, state: Mapping[str, torch.Tensor], model_config: Any) -> Path:
    """`state` as `folder/model.safetensors` (tied weights once, as `save_pretrained` writes them),
    with the model's `config.json` when the folder has none."""
    folder.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), int(tensor.storage_offset()), tuple(tensor.shape))
        if key in seen:  # a tied alias (lm_head of tied embeddings): loaders re-tie it
            continue
        seen.add(key)
        tensors[name] = tensor.detach().to("cpu").contiguous()
    tmp = folder / f".{WEIGHTS_FILE}.tmp"
    save_file(tensors, str(tmp), metadata={"format": "pt"})
    os.replace(tmp, folder / WEIGHTS_FILE)
    for stale in [*folder.glob("*.safetensors"), *folder.glob("*.safetensors.index.json")]:
        if stale.name != WEIGHTS_FILE:
            stale.unlink()
    if not (folder / "config.json").exists():
        model_config.to_json_file(str(folder / ".config.json.tmp"))
        os.replace(folder / ".config.json.tmp", folder / "config.json")
    return folder


def write_adapter(folder: Path, peft_model: Any) -> Path:
    """The peft model's adapter (`adapter_config.json`, `adapter_model.safetensors`) in `folder`."""
    tmp = folder.with_name(f".{folder.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model.save_pretrained(str(tmp))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(tmp, folder)
    return folder


def remove_folder(folder: Path | None) -> None:
    """A version's folder once the server no longer needs it."""
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)
