"""The folder of converted models: one sub-folder per model, published whole or not at all.

A conversion writes into `.tmp-<name>+<random>` in the cache and renames it to `<name>` once verified,
so a reader sees a complete folder or none. A lock file per name keeps two processes from converting
the same model at once; whoever holds it also deletes temp folders a killed conversion left behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from reinforge.models.errors import ModelSourceError

ENV_VAR = "REINFORGE_MODELS_DIR"
_TMP_PREFIX = ".tmp-"
_LOCK_SUFFIX = ".lock"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
"""Cache names never hold '+', which ends the name in a temp folder's (`.tmp-<name>+<random>`)."""


class CachedModel(BaseModel):
    name: str
    folder: Path
    size_bytes: int


def models_dir() -> Path:
    """`$REINFORGE_MODELS_DIR`, else `~/.cache/reinforge/models`."""
    configured = os.environ.get(ENV_VAR)
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "reinforge" / "models"


def cached_folder(name: str) -> Path | None:
    folder = models_dir() / name
    return folder if folder.is_dir() else None


def gguf_cache_name(path: Path) -> str:
    """A GGUF file's name in the cache: its stem and a digest of its bytes (another file, another name)."""
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    stem = "".join(c if c.isascii() and (c.isalnum() or c in "-_.") else "-" for c in path.stem.lower())
    stem = stem.lstrip("-_.") or "gguf"
    return f"{stem}-{digest.hexdigest()[:12]}"


def publish(name: str, write: Callable[[Path], None]) -> Path:
    """The cached folder `name`, made by `write(folder)` into a temp folder first if it is missing."""
    _check_name(name)
    root = models_dir()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ModelSourceError(f"cannot write the models cache {root} (${ENV_VAR} moves it): {exc}") from exc
    final = root / name
    with _locked(root / f".{name}{_LOCK_SUFFIX}"):
        if final.is_dir():  # another process converted it while this one waited for the lock
            return final
        _clean_leftovers(root, name)
        staging = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}+", dir=root))
        try:
            write(staging / "model")
            os.rename(staging / "model", final)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return final


def list_cached() -> list[CachedModel]:
    root = models_dir()
    if not root.is_dir():
        return []
    return [
        CachedModel(name=entry.name, folder=entry, size_bytes=folder_size(entry))
        for entry in sorted(root.iterdir())
        if entry.is_dir() and not entry.name.startswith(".")
    ]


def remove_cached(name: str) -> bool:
    """Delete the cached folder `name`; False when there was none."""
    _check_name(name)
    root = models_dir()
    folder = root / name
    if not folder.is_dir():
        return False
    with _locked(root / f".{name}{_LOCK_SUFFIX}"):
        # Renamed away first, so no reader ever sees a half-deleted folder.
        doomed = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{name}+", dir=root))
        os.rename(folder, doomed / "model")
        shutil.rmtree(doomed, ignore_errors=True)
    return True


def folder_size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise ModelSourceError(f"{name!r} is not a model name for the cache")


def _clean_leftovers(root: Path, name: str) -> None:
    for leftover in root.glob(f"{_TMP_PREFIX}{name}+*"):
        shutil.rmtree(leftover, ignore_errors=True)


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
