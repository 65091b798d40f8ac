"""Agents as commands, in any language: the task goes in through the environment, the reward comes out
through the gateway's reward URL or a last `REINFORGE_REWARD=<float>` stdout line, and an
OpenTelemetry SDK in the command exports its traces to the attempt on the gateway (`otlp_env`).

The process runs in its own process group, so a timeout or a cancellation kills everything it started
(a shell's children, a browser, a sandbox). Its environment is built from an allow-list: it holds the
attempt's own token and nothing of the trainer's (no store token, no gateway secret).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import IO, Any
from urllib.parse import quote

from reinforge.errors import InvalidRequestError, ReinforgeError
from reinforge.runner.llm import LLM
from reinforge.tracing.api import reward_value

REWARD_LINE_PREFIX = "REINFORGE_REWARD="

INHERITED_ENV = (
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
    "TMPDIR", "TEMP", "TMP", "PYTHONPATH", "VIRTUAL_ENV", "NODE_PATH", "SSL_CERT_FILE", "SSL_CERT_DIR",
)  # fmt: skip
"""What a command inherits from the runner's environment; anything else must be named in `pass_env`."""

MAX_ENV_VALUE_BYTES = 128 * 1024 - 1
"""Linux refuses a single environment string longer than this (MAX_ARG_STRLEN)."""

_TAIL_BYTES = 8192

OTLP_TRACES_ENDPOINT = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_TRACES_HEADERS = "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
OTLP_TRACES_PROTOCOL = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"
OTEL_SERVICE_NAME = "OTEL_SERVICE_NAME"
DEFAULT_SERVICE_NAME = "reinforge-agent"


def otlp_env(llm: LLM, service_name: str | None = None) -> dict[str, str]:
    """The OpenTelemetry SDK settings that send a command's traces to its attempt on the gateway
    (`POST <attempt>/v1/traces`, keyed like its LLM calls), in the OTel spec's environment format.
    Empty for an LLM no runner made (it has no attempt URL)."""
    if not llm.attempt_root:
        return {}
    return {
        OTLP_TRACES_ENDPOINT: f"{llm.attempt_root}/v1/traces",
        OTLP_TRACES_HEADERS: "Authorization=" + quote(f"Bearer {llm.api_key}", safe=""),
        OTLP_TRACES_PROTOCOL: "http/protobuf",
        OTEL_SERVICE_NAME: service_name or DEFAULT_SERVICE_NAME,
    }


class AgentProcessError(ReinforgeError):
    """The agent's command exited with a non-zero status (or could not be started)."""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int
    reward: float | None
    """From the last `REINFORGE_REWARD=<float>` line the command printed, if any."""
    stdout_tail: str
    stderr_tail: str


class _OutputReader:
    """Reads a stream to its end in chunks (lines may be arbitrarily long), keeping only a bounded
    tail and the last reward line."""

    def __init__(self) -> None:
        self.tail = bytearray()
        self.reward_line: str | None = None
        self._partial = bytearray()

    def _line(self, line: bytes | bytearray) -> None:
        text = line.decode(errors="replace").strip()
        if text.startswith(REWARD_LINE_PREFIX):
            self.reward_line = text[len(REWARD_LINE_PREFIX) :].strip()

    async def read(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(65536):
            self.tail += chunk
            del self.tail[:-_TAIL_BYTES]
            self._partial += chunk
            *lines, rest = self._partial.split(b"\n")
            for line in lines:
                self._line(line)
            # A reward line is short; a longer unterminated line can be dropped without losing one.
            self._partial = bytearray(rest[-4096:])
        if self._partial:
            self._line(bytes(self._partial))

    def text(self) -> str:
        return self.tail.decode(errors="replace")


def kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a whole process group; one already gone (or not ours) is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


async def process_exited(proc: subprocess.Popen[bytes]) -> None:
    """Return when the process itself has exited, whether or not its children still hold its pipes.
    Uses a pidfd on Linux, else polls; the caller reaps it (`proc.wait()` then returns at once)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:
        return  # already exited and reaped
    except (AttributeError, OSError):
        while proc.poll() is None:
            await asyncio.sleep(0.05)
        return
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def on_exit() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, on_exit)
    try:
        await done
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def _read_pipe(pipe: IO[bytes], into: _OutputReader) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=2**20, loop=loop)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader, loop=loop), pipe)
    try:
        await into.read(reader)
    finally:
        transport.close()


class CommandAgent:
    """Runs `cmd` once per attempt. A string is split like a shell would (no shell features; use
    `sh -c '...'` for pipes). `timeout_s` bounds one attempt; on timeout or cancellation the process
    group gets SIGTERM, then SIGKILL after `kill_grace_s`."""

    def __init__(
        self,
        cmd: str | Sequence[str],
        timeout_s: float | None = 600.0,
        *,
        name: str | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        pass_env: Sequence[str] = (),
        kill_grace_s: float = 2.0,
    ) -> None:
        self.argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
        if not self.argv:
            raise InvalidRequestError("the agent command is empty")
        if timeout_s is not None and timeout_s <= 0:
            raise InvalidRequestError(f"timeout_s must be positive, got {timeout_s}")
        self.timeout_s = timeout_s
        self.name = name
        self.cwd = cwd
        self.extra_env = dict(env or {})
        self.pass_env = tuple(pass_env)
        self.kill_grace_s = kill_grace_s

    def build_env(self, task: dict[str, Any], llm: LLM, rollout_id: str, attempt_id: str) -> dict[str, str]:
        """The command's whole environment: the allow-list, `env`, the OpenTelemetry exporter's
        settings where those left them unset (`otlp_env`), then the attempt's variables."""
        names = (*INHERITED_ENV, *self.pass_env)
        env = {k: os.environ[k] for k in names if k in os.environ}
        env.update(self.extra_env)
        otlp = otlp_env(llm, self.name)
        if OTLP_TRACES_ENDPOINT in env:
            # The user's own collector: the attempt's key and the protocol are not for it.
            otlp = {k: v for k, v in otlp.items() if k not in (OTLP_TRACES_HEADERS, OTLP_TRACES_PROTOCOL)}
        for key, value in otlp.items():
            env.setdefault(key, value)  # what `pass_env` or `env` set wins
        env.update(
            {
                "OPENAI_BASE_URL": llm.base_url,
                "OPENAI_API_KEY": llm.api_key,
                "OPENAI_MODEL": llm.model,
                "REINFORGE_TASK": json.dumps(task),
                "REINFORGE_RESOURCES": json.dumps(llm.resources),
                "REINFORGE_REWARD_URL": llm.reward_url,
                "REINFORGE_ROLLOUT_ID": rollout_id,
                "REINFORGE_ATTEMPT_ID": attempt_id,
            }
        )
        if llm.resources_version is not None:
            env["REINFORGE_RESOURCES_VERSION"] = str(llm.resources_version)
        if llm.agent_name is not None:
            env["REINFORGE_AGENT_NAME"] = llm.agent_name
        for key in ("REINFORGE_TASK", "REINFORGE_RESOURCES"):
            size = len(env[key].encode()) + len(key) + 1
            if size > MAX_ENV_VALUE_BYTES:
                raise InvalidRequestError(
                    f"{key} would be {size} bytes; an environment variable holds at most "
                    f"{MAX_ENV_VALUE_BYTES}. Keep large data in files the task refers to."
                )
        return env

    async def run(self, task: dict[str, Any], llm: LLM, *, rollout_id: str, attempt_id: str) -> CommandResult:
        """Run the command to its end; cancelling this coroutine kills the whole process group."""
        env = self.build_env(task, llm, rollout_id, attempt_id)
        try:
            # subprocess.Popen (vfork) rather than the event loop's subprocess support: measured
            # 0.3-0.5 ms CPU per spawn, against 0.5-0.8 ms for asyncio's and ~2.5 ms for uvloop's
            # (which forks the whole runner process).
            proc = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                cwd=self.cwd,
                start_new_session=True,  # its own process group (pgid == pid), killed as one
            )
        except OSError as e:
            raise AgentProcessError(f"cannot start agent command {self.argv!r}: {e}") from e
        assert proc.stdout is not None and proc.stderr is not None
        out, err = _OutputReader(), _OutputReader()
        readers = asyncio.gather(_read_pipe(proc.stdout, out), _read_pipe(proc.stderr, err))
        try:
            await process_exited(proc)
            # Children left behind would keep the pipes open (and the readers with them) and
            # outlive the attempt.
            kill_group(proc.pid, signal.SIGKILL)
            exit_code = proc.wait()  # it has exited: this only reaps it
            await readers
        except BaseException:
            await self._terminate(proc)
            readers.cancel()
            with contextlib.suppress(BaseException):
                await readers  # closes the pipes
            raise
        reward = None
        if out.reward_line is not None:
            try:
                reward = reward_value(float(out.reward_line))
            except ValueError as e:
                raise AgentProcessError(
                    f"bad {REWARD_LINE_PREFIX} line from the agent: {out.reward_line!r}"
                ) from e
        return CommandResult(
            exit_code=exit_code, reward=reward, stdout_tail=out.text(), stderr_tail=err.text()
        )

    async def _terminate(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.returncode is not None:
            return  # reaped, its group already killed; the pid may belong to someone else by now
        kill_group(proc.pid, signal.SIGTERM)
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(process_exited(proc), self.kill_grace_s)
        finally:
            # Always SIGKILL the group: grandchildren may ignore SIGTERM or outlive their parent.
            kill_group(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            with contextlib.suppress(Exception):
                await asyncio.shield(process_exited(proc))
            proc.poll()  # reaps it (never blocks the loop; an unreaped one is reaped by Popen later)

    def __repr__(self) -> str:
        return f"CommandAgent({shlex.join(self.argv)!r}, timeout_s={self.timeout_s})"
