"""The store server's bearer token: made at `reinforge store serve`, kept in the run folder, 0600.

Anyone who can read the run folder may talk to the store; nobody else can. The environment variable
wins over the file so that a deployment can inject its own secret.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from pathlib import Path

TOKEN_ENV = "REINFORGE_STORE_TOKEN"
"""Environment variable that holds the token for both the server and its clients."""
TOKEN_FILE_NAME = "store.token"
"""Name of the token file inside the run folder."""


def generate_token() -> str:
    """A fresh random token (256 bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / TOKEN_FILE_NAME


def write_token(run_dir: str | Path, token: str) -> Path:
    """Write `token` to `<run_dir>/store.token`, readable by the owner only.

    The file is created with mode 0600 from the start (no window where it is world-readable), and
    an existing file's mode is tightened as well.
    """
    path = token_path(run_dir)
    write_private(path, token)
    return path


def write_private(path: Path, value: str) -> None:
    """Create (or replace) `path` with mode 0600 from the start: never readable by others, not even
    briefly, and an existing file's mode is tightened as well."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, value.encode("utf-8"))
    finally:
        os.close(fd)


def read_token(run_dir: str | Path) -> str | None:
    """The token stored in the run folder, or None when there is no (non-empty) token file."""
    path = token_path(run_dir)
    try:
        token = path.read_text(encoding="utf-8").strip()
    except FileNotFoundError:
        return None
    return token or None


def token_file_is_private(run_dir: str | Path) -> bool:
    """True when the token file is readable and writable by its owner only."""
    mode = token_path(run_dir).stat().st_mode
    return stat.S_IMODE(mode) & 0o077 == 0


def load_or_create_token(run_dir: str | Path) -> str:
    """The token a server started on `run_dir` uses.

    Order: `$REINFORGE_STORE_TOKEN`; else the run folder's token file (a restarted server keeps its
    clients working); else a new token, written to the run folder.
    """
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env
    existing = read_token(run_dir)
    if existing is not None:
        if not token_file_is_private(run_dir):
            # Someone widened the mode; the secret may have leaked, so it is replaced.
            existing = None
        else:
            return existing
    token = generate_token()
    write_token(run_dir, token)
    return token


def resolve_client_token(token: str | None = None, run_dir: str | Path | None = None) -> str | None:
    """The token a client sends: the explicit one, else `$REINFORGE_STORE_TOKEN`, else the run folder's."""
    if token:
        return token
    from_env = os.environ.get(TOKEN_ENV, "").strip()
    if from_env:
        return from_env
    if run_dir is not None:
        return read_token(run_dir)
    return None


def tokens_match(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing leaks nothing about the token."""
    if given is None:
        return False
    # compare_digest on str rejects non-ASCII; bytes compare works for whatever a client sends.
    return hmac.compare_digest(given.encode("utf-8", "surrogateescape"), expected.encode("utf-8"))
