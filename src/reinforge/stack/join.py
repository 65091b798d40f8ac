"""What a runner needs to join a served run: the gateway secret kept in the run folder, and the exact
`reinforge runner` command that joins, with every secret passed by environment, never in argv.

A runner signs each attempt's token with the gateway secret (`reinforge.access`), so the secret must
outlive one server process: a runner on another machine keeps working across a restart of the
server (or a resumed training run) on the same run folder. Like the store token it lives in the run
folder with mode 0600, and `$REINFORGE_GATEWAY_SECRET` wins over the file so a deployment can inject
its own.
"""

from __future__ import annotations

import os
import secrets
import shlex
import socket
import stat
from collections.abc import Sequence
from pathlib import Path

from reinforge.store.http.auth import TOKEN_ENV, token_path, write_private

GATEWAY_SECRET_ENV = "REINFORGE_GATEWAY_SECRET"
"""Environment variable holding the gateway secret, for the server and the runners alike."""
GATEWAY_SECRET_FILE_NAME = "gateway.secret"
"""Name of the gateway secret's file inside the run folder."""


def gateway_secret_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / GATEWAY_SECRET_FILE_NAME


def load_or_create_gateway_secret(run_dir: str | Path) -> str:
    """`$REINFORGE_GATEWAY_SECRET`; else the run folder's `gateway.secret` (when only its owner can
    read it: a widened file may have leaked and is replaced); else a new secret, written there."""
    from_env = os.environ.get(GATEWAY_SECRET_ENV, "").strip()
    if from_env:
        return from_env
    path = gateway_secret_path(run_dir)
    try:
        existing = path.read_text(encoding="utf-8").strip()
        private = stat.S_IMODE(path.stat().st_mode) & 0o077 == 0
    except FileNotFoundError:
        existing, private = "", False
    if existing and private:
        return existing
    secret = secrets.token_urlsafe(32)
    write_private(path, secret)
    return secret


def _secret_source(env_name: str, path: Path) -> str:
    """The shell text a runner's environment gets a secret from: the variable the server itself read
    it from, else the file (copy it to the runner's machine)."""
    if os.environ.get(env_name, "").strip():
        return f'"${env_name}"'
    return f'"$(cat {shlex.quote(str(path.resolve()))})"'


def runner_join_command(
    store_url: str, run_dir: str | Path, runner_args: Sequence[str] = ("--agent", "MODULE:FUNCTION")
) -> str:
    """The `reinforge runner` command line that joins the store at `store_url` (its gateway mounted
    at `<store_url>/gateway`), with the store token and the gateway secret read from the run folder's
    files (or the variables the server took them from) into the runner's environment."""
    token = _secret_source(TOKEN_ENV, token_path(run_dir))
    secret = _secret_source(GATEWAY_SECRET_ENV, gateway_secret_path(run_dir))
    args = shlex.join(["--store", store_url, *runner_args])
    return f"{TOKEN_ENV}={token} {GATEWAY_SECRET_ENV}={secret} reinforge runner {args}"


def url_for_others(host: str, port: int) -> str:
    """The URL a runner elsewhere reaches a server bound to `host` at: the host itself, or for a
    wildcard bind this machine's name (pass `--public-url` when others know it by another)."""
    shown = socket.getfqdn() if host in ("0.0.0.0", "::") else host
    if ":" in shown:
        shown = f"[{shown}]"
    return f"http://{shown}:{port}"
