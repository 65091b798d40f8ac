"""The agentlightning 1.0.2 baseline: its own Python 3.12 venv, its server process, its drivers.

The benchmarks compare reinforge with agentlightning measured in the same run on the same machine.
agentlightning needs Python >= 3.12 and pins its own dependencies, so it lives in `.bench/agl-venv`
(made on first use, reused afterwards) and is only ever driven through subprocesses: its server
(`baselines/agl_server.py`) and small drivers that print JSON on stdout.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

AGL_VERSION = "1.0.2"
REPO = Path(__file__).resolve().parent.parent
BENCH_DIR = REPO / ".bench"
AGL_VENV = BENCH_DIR / "agl-venv"
BASELINES = Path(__file__).resolve().parent / "baselines"


class BaselineUnavailable(RuntimeError):
    """The baseline could not be installed or started; the message says why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_http(url: str, timeout: float = 60.0, proc: subprocess.Popen[Any] | None = None) -> None:
    """Poll `url` until it answers 200 (a server's health route)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BaselineUnavailable(f"the server exited with code {proc.returncode} during start-up")
        try:
            if httpx.get(url, timeout=2.0).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise BaselineUnavailable(f"{url} did not answer within {timeout:.0f}s")


def _find_python312() -> str:
    """A working Python 3.12 interpreter (a pyenv shim named python3.12 may exist but not run)."""
    candidates = [shutil.which("python3.12") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.12*/bin/python3.12")))
    candidates += ["/usr/bin/python3.12", "/usr/local/bin/python3.12"]
    for candidate in candidates:
        if not candidate:
            continue
        try:
            out = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and out.stdout.startswith("Python 3.12"):
            return candidate
    raise BaselineUnavailable("no working python3.12 found (agentlightning 1.0.2 needs Python >= 3.12)")


def agl_python() -> Path:
    """The baseline venv's interpreter, creating the venv and installing agentlightning if needed."""
    python = AGL_VENV / "bin" / "python"
    probe = f"import agentlightning, sys; sys.exit(agentlightning.__version__ != {AGL_VERSION!r})"
    check = [str(python), "-c", probe]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"installing agentlightning=={AGL_VERSION} into {AGL_VENV} (first run only)...", flush=True)
    BENCH_DIR.mkdir(exist_ok=True)
    steps = [
        [_find_python312(), "-m", "venv", "--clear", str(AGL_VENV)],
        [str(python), "-m", "pip", "install", "-q", f"agentlightning=={AGL_VERSION}"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise BaselineUnavailable(f"`{' '.join(step)}` failed: " + " | ".join(tail))
    if subprocess.run(check, capture_output=True).returncode != 0:
        raise BaselineUnavailable(f"agentlightning {AGL_VERSION} is not importable after install")
    return python


class AglServer:
    """agentlightning's server (in-memory store + LLM proxy) in its own process on a free port."""

    def __init__(self, python: Path, model_name: str = "policy") -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc = subprocess.Popen(
            [str(python), str(BASELINES / "agl_server.py"), str(self.port), model_name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        try:
            wait_http(self.url + "/healthz", proc=self._proc)
        except BaselineUnavailable:
            self.stop()
            raise

    @property
    def pid(self) -> int:
        return self._proc.pid

    def stop(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> AglServer:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def run_driver(python: Path, script: str, *args: str, timeout: float = 1800.0) -> dict[str, Any]:
    """Run `baselines/<script>` in the baseline venv; returns the JSON object it printed last."""
    done = subprocess.run(
        [str(python), str(BASELINES / script), *args], capture_output=True, text=True, timeout=timeout
    )
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-3000:])
        raise BaselineUnavailable(f"{script} failed with exit code {done.returncode}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise BaselineUnavailable(f"{script} printed no JSON result")
    result: dict[str, Any] = json.loads(lines[-1])
    return result
