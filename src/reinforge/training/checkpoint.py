"""Checkpoints with exact resume: weights, optimiser, step, every RNG, the data position, the history.

A checkpoint is a folder `checkpoints/step-<N>/` written under a temporary name and renamed into
place, so a run killed mid-write leaves the previous checkpoint intact and never a half one.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field

from reinforge.errors import InvalidRequestError

_STATE_FILE = "trainer_state.pt"


class CheckpointMeta(BaseModel):
    """What a checkpoint says about the run besides tensors (stored inside the state file)."""

    model_config = ConfigDict(extra="forbid")

    step: int = Field(ge=0)
    policy_version: int = Field(ge=0)
    sampler: dict[str, Any]
    rl_seconds: float = 0.0
    """RL wall time spent before the checkpoint, so a resumed run keeps to the same time budget."""
    extra: dict[str, Any] = Field(default_factory=dict)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:06d}"


def save_checkpoint(root: Path, meta: CheckpointMeta, policy_state: dict[str, Any], *, keep: int = 2) -> Path:
    """Write checkpoint `meta.step` under `root` and keep only the newest `keep` checkpoints."""
    root.mkdir(parents=True, exist_ok=True)
    final = _step_dir(root, meta.step)
    tmp = root / f".tmp-{meta.step}-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    torch.save(
        {"meta": meta.model_dump(mode="json"), "policy": policy_state, "rng": rng_state()},
        tmp / _STATE_FILE,
    )
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(root)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(root: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.glob("step-*") if (p / _STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[1]))


def latest_checkpoint(root: Path) -> Path | None:
    found = list_checkpoints(root)
    return found[-1] if found else None


def load_checkpoint(path: Path) -> tuple[CheckpointMeta, dict[str, Any], dict[str, Any]]:
    """(meta, policy state, RNG state) of the checkpoint at `path`."""
    file = path / _STATE_FILE
    if not file.is_file():
        raise InvalidRequestError(f"{path} is not a reinforge checkpoint (no {_STATE_FILE})")
    # weights_only=False: the RNG states hold numpy arrays and tuples; the file is our own.
    data = torch.load(file, map_location="cpu", weights_only=False)
    return CheckpointMeta.model_validate(data["meta"]), data["policy"], data["rng"]
