"""Start `reinforge store serve` as a real process and wait until it says where it listens."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path


class ServedStore:
    """One `reinforge store serve` process on a run folder (port picked by the OS).

    Run as `python -m reinforge.cli store serve`, as a user runs it (the training stack's torch is
    imported only when a command needs it).
    """

    def __init__(
        self,
        run_dir: Path,
        db: str | None = None,
        env: dict[str, str] | None = None,
        options: Sequence[str] = (),
    ) -> None:
        self.run_dir = run_dir
        url_file = run_dir / "store.url"
        url_file.unlink(missing_ok=True)  # a SIGKILLed server leaves its URL file behind
        args = [
            sys.executable,
            "-m",
            "reinforge.cli",
            "store",
            "serve",
            "--run-dir",
            str(run_dir),
            "--port",
            "0",
        ]
        if db:
            args += ["--db", db]
        args += options
        self.log = run_dir / f"serve-{time.monotonic_ns()}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                args, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})}
            )
        deadline = time.monotonic() + 90
        while not url_file.exists():
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"store serve exited with {self.process.returncode}: {self.log.read_text()}"
                )
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"store serve did not start: {self.log.read_text()}")
            time.sleep(0.05)
        self.url = url_file.read_text().strip()

    @property
    def token(self) -> str:
        return (self.run_dir / "store.token").read_text()

    def kill(self) -> None:
        """SIGKILL: no shutdown handler, no flush, no goodbye."""
        if self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def terminate(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout=30)
