"""`[trainer.compute]` resolved: the torch device the update runs on and its autocast precision.

Resolved once, at the start of a fit, so a setting the machine cannot honour (CUDA asked for, none
present) stops the run before anything starts, with what to change, instead of failing mid-step.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import torch

from reinforge.errors import InvalidRequestError
from reinforge.training.config import ComputeSettings

BFLOAT16_CPU_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})
"""CPU features that run bfloat16 matrix products natively; without them autocast emulates
bfloat16 and is slower than float32 (docs/training.md)."""


def native_bfloat16(device: torch.device, cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether bfloat16 autocast is a speed-up on `device`: a CUDA GPU that supports it, or a CPU
    whose flags (Linux's `/proc/cpuinfo`) name AMX or AVX512-BF16."""
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    if device.type != "cpu":
        return False
    try:
        text = cpuinfo.read_text()
    except OSError:
        return False
    flags = {word for line in text.splitlines() if line.startswith("flags") for word in line.split()}
    return bool(flags & BFLOAT16_CPU_FLAGS)


@dataclass(frozen=True)
class Placement:
    """Where the update computes: `device`, and `autocast` (None: float32 throughout; bfloat16:
    forward passes under bf16 autocast, float32 weights, gradients and optimiser state)."""

    device: torch.device
    autocast: torch.dtype | None = None

    @property
    def engine_dtype(self) -> torch.dtype:
        """The dtype the embedded engine serves in: the update's compute precision."""
        return self.autocast or torch.float32

    def forward_context(self) -> AbstractContextManager[object]:
        """The context each forward pass of the update runs in."""
        if self.autocast is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.autocast)


CPU = Placement(torch.device("cpu"))


def resolve_placement(settings: ComputeSettings, *, local_rank: int | None = None) -> Placement:
    """The placement `settings` name on this machine. `local_rank` is this process's index among
    the training processes on its machine (None: one process): "auto" and "cuda" then mean its own
    GPU, and a fixed "cuda:N" is refused, since every process would share that one GPU."""
    wanted = settings.device
    has_cuda = torch.cuda.is_available()
    if wanted.startswith("cuda") and not has_cuda:
        build = f"a CUDA {torch.version.cuda} build" if torch.version.cuda else "a CPU-only build"
        raise InvalidRequestError(
            f"compute.device = {wanted!r}, but torch {torch.__version__} ({build}) sees no CUDA GPU; "
            "set [trainer.compute] device = 'cpu' (or 'auto'), or install a CUDA build of torch"
        )
    if wanted == "cpu" or (wanted == "auto" and not has_cuda):
        device = torch.device("cpu")
    elif wanted in ("auto", "cuda"):
        device = torch.device("cuda", local_rank or 0)
    else:
        if local_rank is not None:
            raise InvalidRequestError(
                f"compute.device = {wanted!r} names one GPU for every training process; "
                "use 'cuda' (each process takes cuda:<LOCAL_RANK>)"
            )
        device = torch.device(wanted)
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise InvalidRequestError(
            f"{device} does not exist: torch sees {torch.cuda.device_count()} CUDA device(s)"
        )
    dtype = settings.dtype
    if dtype == "float32" or (dtype == "auto" and device.type == "cpu"):
        return Placement(device)
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise InvalidRequestError(
            f"{torch.cuda.get_device_name(device)} has no bfloat16 support; set compute.dtype = 'float32'"
        )
    return Placement(device, torch.bfloat16)
