"""Where an attempt's processes run: Linux namespaces when the machine allows them, else nothing.

`NamespaceSandbox` uses `unshare` (util-linux) for a user, mount, network and pid namespace per
process tree, with `sandbox_init.py` as the namespace's first process (docs/harnesses.md, "What is
confined"). The network namespace has only loopback; the gateway is reached through a relay over a
Unix socket this side serves, so the attempt can open no other connection. Killing the process group
kills `unshare`, whose child (the namespace's init) then gets SIGKILL, and with it every process in
the namespace, including any that called setsid().

`UnconfinedSandbox` runs the process as the runner's user with the same limits and the same
process-group kill, and nothing hidden: for machines without user namespaces, chosen explicitly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from reinforge.errors import InvalidRequestError
from reinforge.runner.command import kill_group, process_exited

log = logging.getLogger(__name__)

INIT_SCRIPT = Path(__file__).with_name("sandbox_init.py")
SOCKET_NAME = "gateway.sock"
_UNSHARE_FLAGS = ("--user", "--map-root-user", "--mount", "--net", "--pid", "--fork", "--kill-child")


@dataclass(frozen=True)
class Limits:
    """Per-process limits of one run: wall clock for the whole tree, address space and CPU seconds
    for each process in it."""

    timeout_s: float
    memory_mb: int | None = 4096
    cpu_seconds: int | None = None


@dataclass(frozen=True)
class RunResult:
    exit_code: int
    timed_out: bool
    stdout_path: Path
    stderr_path: Path

    def stderr_tail(self, limit: int = 4000) -> str:
        return _tail(self.stderr_path, limit)

    def stdout_tail(self, limit: int = 4000) -> str:
        return _tail(self.stdout_path, limit)


def _tail(path: Path, limit: int) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return ""
    return data[-limit:].decode(errors="replace")


class Sandbox(Protocol):
    name: str

    def inside_url(self, url: str) -> str:
        """`url` (the gateway's) as a process in the sandbox reaches it."""
        ...

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        writable: Sequence[Path],
        hide: Sequence[Path],
        limits: Limits,
        logs: Path,
        log_name: str,
        gateway_url: str | None,
    ) -> RunResult:
        """Run `argv` to its end or its time limit; stdout/stderr go to `logs/<log_name>.out|.err`."""
        ...


def _set_limits(limits: Limits) -> None:
    if limits.memory_mb:
        size = limits.memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (size, size))
    if limits.cpu_seconds:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_seconds, limits.cpu_seconds + 5))


async def _run_group(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    logs: Path,
    log_name: str,
    timeout_s: float,
    preexec: Callable[[], object] | None = None,
) -> RunResult:
    """Run in a new process group; on timeout or cancellation SIGKILL the whole group."""
    logs.mkdir(parents=True, exist_ok=True)
    out_path, err_path = logs / f"{log_name}.out", logs / f"{log_name}.err"
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            list(argv),
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
            preexec_fn=preexec,
        )
    timed_out = False
    try:
        await asyncio.wait_for(process_exited(proc), timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        kill_group(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        code = await asyncio.get_running_loop().run_in_executor(None, proc.wait)
    return RunResult(exit_code=code, timed_out=timed_out, stdout_path=out_path, stderr_path=err_path)


class UnconfinedSandbox:
    """No confinement beyond limits and the group kill: the process sees what the runner sees."""

    name = "none"

    def inside_url(self, url: str) -> str:
        return url

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        writable: Sequence[Path],
        hide: Sequence[Path],
        limits: Limits,
        logs: Path,
        log_name: str,
        gateway_url: str | None,
    ) -> RunResult:
        return await _run_group(
            argv,
            cwd=cwd,
            env=env,
            logs=logs,
            log_name=log_name,
            timeout_s=limits.timeout_s,
            preexec=functools.partial(_set_limits, limits),
        )


def _host_port(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    if parts.hostname is None:
        raise InvalidRequestError(f"the gateway URL {url!r} names no host")
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy one way; at the end, half-close (the other way may still be answering)."""
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass


async def _splice(
    a: tuple[asyncio.StreamReader, asyncio.StreamWriter], b: tuple[asyncio.StreamReader, asyncio.StreamWriter]
) -> None:
    try:
        await asyncio.gather(_pipe(a[0], b[1]), _pipe(b[0], a[1]))
    finally:
        for writer in (a[1], b[1]):
            with contextlib.suppress(Exception):
                writer.close()


@contextlib.asynccontextmanager
async def _gateway_relay(gateway_url: str) -> AsyncIterator[Path]:
    """A Unix socket (in a short, private directory) whose every connection is piped to the gateway."""
    host, port = _host_port(gateway_url)
    directory = Path(tempfile.mkdtemp(prefix="rf-gw-"))
    tasks: set[asyncio.Future[Any]] = set()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(host, port)
        except OSError:
            writer.close()
            return
        task = asyncio.ensure_future(_splice((reader, writer), (up_reader, up_writer)))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    server = await asyncio.start_unix_server(handle, path=str(directory / SOCKET_NAME))
    try:
        yield directory
    finally:
        server.close()
        for task in list(tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await server.wait_closed()
        shutil.rmtree(directory, ignore_errors=True)


class NamespaceSandbox:
    """User + mount + network + pid namespaces through `unshare`; see the module docstring."""

    name = "namespaces"

    def __init__(self, unshare: str = "unshare", python: str = sys.executable) -> None:
        self.unshare = unshare
        self.python = python

    def inside_url(self, url: str) -> str:
        parts = urlsplit(url)
        _, port = _host_port(url)
        return urlunsplit(parts._replace(netloc=f"127.0.0.1:{port}"))

    async def run(
        self,
        argv: Sequence[str],
        *,
        cwd: Path,
        env: Mapping[str, str],
        writable: Sequence[Path],
        hide: Sequence[Path],
        limits: Limits,
        logs: Path,
        log_name: str,
        gateway_url: str | None,
    ) -> RunResult:
        async with contextlib.AsyncExitStack() as stack:
            if gateway_url is not None:
                socket_dir = await stack.enter_async_context(_gateway_relay(gateway_url))
                port: int | None = _host_port(gateway_url)[1]
            else:
                socket_dir, port = Path(tempfile.gettempdir()), None
            config = {
                "argv": list(argv),
                "cwd": str(cwd),
                "env": dict(env),
                "hide": [str(p) for p in _outermost(hide)],
                "binds": [str(p) for p in writable],
                "read_only": [str(p) for p in _needed_under(hide)],
                "socket_dir": str(socket_dir),
                "socket_name": SOCKET_NAME,
                "port": port,
                "memory_mb": limits.memory_mb,
                "cpu_seconds": limits.cpu_seconds,
            }
            # A file, not an argument: an instruction may be longer than one argument can be.
            logs.mkdir(parents=True, exist_ok=True)
            config_path = logs / f"{log_name}.sandbox.json"
            config_path.write_text(json.dumps(config))
            command = [self.unshare, *_UNSHARE_FLAGS, "--mount-proc", self.python, "-I", str(INIT_SCRIPT)]
            return await _run_group(
                [*command, str(config_path)],
                cwd=Path("/"),
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin")},
                logs=logs,
                log_name=log_name,
                timeout_s=limits.timeout_s,
            )
        raise AssertionError("unreachable")  # pragma: no cover


def needed_paths() -> list[Path]:
    """What every process in a sandbox needs to see: the Python installation and its environment."""
    paths = {
        Path(sys.prefix).resolve(),
        Path(sys.base_prefix).resolve(),
        Path(sys.executable).resolve().parent,
    }
    return _outermost(sorted(paths))


def _needed_under(hide: Sequence[Path]) -> list[Path]:
    hidden = _outermost(hide)
    return [n for n in needed_paths() if any(n.is_relative_to(h) for h in hidden)]


def _outermost(paths: Sequence[Path]) -> list[Path]:
    """Paths with those inside another listed path dropped (the outer tmpfs hides them already)."""
    resolved = sorted({p.resolve() for p in paths}, key=lambda p: len(p.parts))
    kept: list[Path] = []
    for path in resolved:
        if not any(path.is_relative_to(k) for k in kept):
            kept.append(path)
    return kept


@functools.cache
def namespaces_available(unshare: str = "unshare") -> bool:
    """Whether this machine lets an unprivileged process create the namespaces (tried once)."""
    if shutil.which(unshare) is None:
        return False
    try:
        done = subprocess.run(
            [unshare, *_UNSHARE_FLAGS, "--mount-proc", "true"], capture_output=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def default_sandbox(kind: str = "auto") -> Sandbox:
    """`auto`: namespaces when available, else refuse (an unconfined run is asked for by name);
    `namespaces`; `none`."""
    if kind == "none":
        return UnconfinedSandbox()
    if kind in ("auto", "namespaces"):
        if namespaces_available():
            return NamespaceSandbox()
        raise InvalidRequestError(
            "this machine cannot create user namespaces (`unshare --user --map-root-user` fails), so "
            "attempts cannot be confined; pass sandbox='none' to run them unconfined (docs/harnesses.md)"
        )
    raise InvalidRequestError(f"unknown sandbox {kind!r}; use 'auto', 'namespaces' or 'none'")
