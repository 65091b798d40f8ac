"""Fused CPU kernels for the slot-cache runner (`fused_kernels.cpp`, `panel_linear.cpp`), compiled on
first use.

At decode sizes (a few dozen rows) a layer's glue between its matrix products (cascade attention's
per-row parts and joins, RoPE and the cache writes, residual adds and norms, SwiGLU's middle) costs
more in eager calls than in arithmetic: docs/engine.md, "Fused CPU kernels". These kernels do that
glue in a handful of calls. The projections run on weights packed in panels (`engine.linear`) on
AVX2 and AVX-512 CPUs; attention's larger products stay with ATen.

They are built with `torch.utils.cpp_extension` into the user cache (`~/.cache/reinforge/kernels`,
`REINFORGE_KERNELS_DIR` elsewhere), once per source, torch version and instruction set, and loaded
from there afterwards. Where they cannot be built (no C++ compiler, no ninja) the runner keeps its
eager PyTorch path and this says why once; `REINFORGE_FUSED_KERNELS=0` chooses that path outright.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import platform
import shutil
import sys
import threading
from pathlib import Path
from types import ModuleType

import torch

log = logging.getLogger(__name__)

SOURCES = (Path(__file__).with_name("fused_kernels.cpp"), Path(__file__).with_name("panel_linear.cpp"))
ENABLE_ENV = "REINFORGE_FUSED_KERNELS"
DIR_ENV = "REINFORGE_KERNELS_DIR"

_lock = threading.Lock()
_loaded: ModuleType | None = None
_failure: str | None = None

_AVX512 = {"avx512f", "avx512bw", "avx512vl", "avx512dq"}


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return set()


def instruction_set() -> tuple[str, list[str]]:
    """The vector instruction set the kernels are compiled for here, and its compiler flags: the same
    tiers ATen's own CPU kernels are built for (`at::vec::Vectorized` picks its width from them)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return "default", []
    flags = _cpu_flags()
    if flags >= _AVX512 and "fma" in flags:
        return "avx512", ["-DCPU_CAPABILITY=AVX512", "-DCPU_CAPABILITY_AVX512", "-mavx512f", "-mavx512bw",
                          "-mavx512vl", "-mavx512dq", "-mavx2", "-mfma"]  # fmt: skip
    if {"avx2", "fma"} <= flags:
        return "avx2", ["-DCPU_CAPABILITY=AVX2", "-DCPU_CAPABILITY_AVX2", "-mavx2", "-mfma"]
    return "default", []


def _build_dir(name: str) -> Path:
    root = Path(os.environ.get(DIR_ENV) or Path.home() / ".cache" / "reinforge" / "kernels")
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _import(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build() -> ModuleType:
    tier, flags = instruction_set()
    cflags = ["-O3", "-fopenmp", *flags]
    text = b"".join(source.read_bytes() for source in SOURCES)
    key = hashlib.sha256(text + torch.__version__.encode() + " ".join(cflags).encode()).hexdigest()[:12]
    name = f"reinforge_fused_{tier}_{key}"
    folder = _build_dir(name)
    built = folder / f"{name}.so"
    if built.exists() and not (folder / "lock").exists():
        # The name is the source's, torch's and the flags' hash, so a library by that name is this
        # build: imported straight away, without cpp_extension's own check and its setuptools import
        # (~50 ms in every engine process). While another process builds it holds `lock` there, and
        # cpp_extension below waits for it.
        return _import(name, built)
    from torch.utils import cpp_extension  # imported here: it pulls in setuptools

    # The venv's own ninja (the `ninja` package) when the venv's bin is not on PATH.
    scripts = str(Path(sys.executable).parent)
    if shutil.which("ninja") is None and (Path(scripts) / "ninja").exists():
        os.environ["PATH"] = scripts + os.pathsep + os.environ.get("PATH", "")
    module: ModuleType = cpp_extension.load(
        name=name,
        sources=[str(source) for source in SOURCES],
        extra_cflags=cflags,
        extra_ldflags=["-fopenmp"],  # libgomp: the one torch has loaded already (same soname)
        build_directory=str(folder),
        verbose=False,
    )
    return module


def kernels() -> ModuleType | None:
    """The compiled kernels, building them the first time; None where they are turned off or could
    not be built (the reason is logged once, and kept in `failure()`)."""
    global _loaded, _failure
    if os.environ.get(ENABLE_ENV, "1") == "0":
        return None
    if _loaded is not None or _failure is not None:
        return _loaded
    with _lock:
        if _loaded is None and _failure is None:
            try:
                _loaded = _build()
            except Exception as exc:  # a missing compiler or ninja, a failed build: the eager path serves
                _failure = _reason(exc)
                log.warning("fused CPU kernels unavailable, using eager PyTorch (%s)", _failure)
    return _loaded


def loaded() -> ModuleType | None:
    """The kernels if `kernels()` has loaded them, whatever the switch says now: what already packed
    weights for them (`engine.linear`) keeps multiplying with."""
    return _loaded


def _reason(exc: Exception) -> str:
    """A failed build's cause in a line or a few: the compiler's error lines where there are any (the
    exception ends with ninja's "build stopped", which says nothing)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if ": error:" in line or ": fatal error:" in line]
    return f"{type(exc).__name__}: " + (" | ".join(errors[:3]) if errors else (lines[-1] if lines else ""))


def compiler_available() -> bool:
    """Whether a C++ compiler is on this machine (`CXX`, else `c++`): where one is, the kernels are
    expected to build, and a failure is a bug rather than a missing tool."""
    return shutil.which(os.environ.get("CXX", "c++")) is not None


def failure() -> str | None:
    """Why `kernels()` returned None, if it tried and failed."""
    return _failure


def usable(*tensors: torch.Tensor) -> bool:
    """Whether the kernels can take these tensors: float32 on the CPU (the only dtype they handle)."""
    return all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
