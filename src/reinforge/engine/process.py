"""`EngineProcess`: the embedded `Engine`, run in a child process behind the same asyncio API.

Why: in one process the engine's scheduling loop shares the interpreter lock with the gateway and
the store, which answer the agents' calls while the engine generates. With the agents in runner
processes, that lock was the trainer's bottleneck (the process sat at one core while the machine
had room): the engine's Python ran far slower in `Trainer.fit` than the same engine alone.
In its own process the engine has its own lock and its own core.

What crosses the pipe: requests (prompt ids, sampling; those a loop pass makes travel together, as
a step's released calls do), results (`EngineOutput`, stream deltas; batched the same way),
and weight updates (a few bytes naming a buffer both processes map, `_SharedWeights`; a path to
a safetensors file is passed as it is). Requests, results and the child's errors keep their types.
If the child dies, every pending call fails with `EngineError` (`EngineProcessDiedError`); with an
`EngineRestartPolicy` the parent then starts a new child serving the weights of the last version it
published, and calls made meanwhile wait for it (only a crash loop leaves the engine failed); without
one, later calls fail too. If the parent dies, the child sees its pipe close and exits.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import pickle
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Self

import torch
from transformers import PreTrainedTokenizerBase

from reinforge._heap import freeze_startup_heap
from reinforge.engine.adapters import LORA_PREFIX
from reinforge.engine.engine import Engine, EngineDelta, EngineOutput
from reinforge.engine.errors import EngineError, EngineStoppedError
from reinforge.engine.lifecycle import StartStop
from reinforge.engine.weights import WeightsSource, apply_state_dict, read_state_dict
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams
from reinforge.restarts import DeathWindow, RestartPolicy

logger = logging.getLogger(__name__)

_START_TIMEOUT_S = 180.0
_PUBLISH_TRIES = 3
"""A weight update cut off by the child's death is sent again to its successor this often at most."""


class EngineProcessDiedError(EngineError):
    """The engine's child process died while the call ran; the call may be retried (a restarted
    child serves it when the engine has an `EngineRestartPolicy`)."""


@dataclass(frozen=True)
class EngineRestartPolicy(RestartPolicy):
    """Whether and how a dead engine child is replaced.

    Each death starts a new child (after `backoff_s`, doubled per earlier death in the window);
    `crash_loop_deaths` deaths within `crash_loop_window_s` leave the engine failed instead, with
    the exit codes in its error.
    """

    backoff_s: float = 0.2
    max_backoff_s: float = 10.0
    crash_loop_deaths: int = 4
    crash_loop_window_s: float = 120.0


@dataclass
class _Call:
    """A request waiting on the child: results go to `queue` on the caller's loop."""

    loop: asyncio.AbstractEventLoop
    queue: asyncio.Queue[tuple[str, Any]] = field(default_factory=asyncio.Queue)


class EngineProcess(StartStop):
    """`Engine(model, tokenizer, ...)` in a child process; `generate`, `stream`,
    `load_weights`, `start`, `stop` and `policy_version` behave as the in-process engine's do."""

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer: PreTrainedTokenizerBase,
        *,
        policy_version: int = 0,
        torch_threads: int | None = None,
        restarts: EngineRestartPolicy | None = None,
        **engine_kwargs: Any,
    ) -> None:
        """`restarts`: replace a dead child (see `EngineRestartPolicy`). The parent then keeps `model`
        (it becomes the engine's: pass a copy you do not update) and applies each published version
        to it, so a new child starts from the weights last served."""
        self.tokenizer = tokenizer
        self._model: torch.nn.Module | None = model
        self._restarts = restarts
        self._adapters: dict[str, dict[str, torch.Tensor]] = {}  # adapter name -> its lora/... tensors
        self._deaths = DeathWindow()
        self._serving = threading.Event()
        self._replacing = False
        self.restarted = 0
        """Children started to replace a dead one."""
        self._kwargs = {**engine_kwargs, "policy_version": policy_version}
        self._threads = torch_threads or torch.get_num_threads()
        self._version = policy_version
        self._fast_path = False
        self._conn: Connection | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._send_lock = threading.Lock()
        self._outbox: list[tuple[Any, ...]] = []  # requests waiting for the end of their loop pass
        self._start_lock = threading.Lock()
        self._calls: dict[int, _Call] = {}
        self._calls_lock = threading.Lock()
        self._ids = itertools.count()
        self._failure: EngineError | None = None
        self._stopping = False
        self._shared = _SharedWeights()
        self._publishing = False

    # ---- lifecycle -------------------------------------------------------------------------------

    @property
    def policy_version(self) -> int:
        """The version of the weights new requests are served with."""
        return self._version

    @property
    def uses_fast_path(self) -> bool:
        return self._fast_path

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    @property
    def failure(self) -> EngineError | None:
        """Why the engine cannot serve any more (its child died and is not being replaced), or None."""
        if self._serving.is_set() or self._replacing or self._stopping:
            return None
        return self._failure

    def start(self) -> Self:
        """Start the child and wait until its engine is ready (seconds: it imports torch). Calls
        made before it start the child themselves, blocking their event loop meanwhile."""
        with self._start_lock:
            if self._process is None:
                if self._stopping:
                    raise EngineStoppedError("the engine was stopped; create a new one")
                self._spawn()
        return self

    def _spawn(self, adapters: Mapping[str, torch.Tensor] | None = None) -> None:
        ours, theirs = socket.socketpair()
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        # A plain child (not multiprocessing's spawn): the caller's script is not re-imported, so it
        # needs no `if __name__ == "__main__"` guard.
        process = subprocess.Popen(
            # `-c`, not `-m reinforge.engine.process`: the package imports this module first, and
            # runpy warns when a module it runs as __main__ is already imported.
            [sys.executable, "-c", _CHILD_ENTRY, str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            env=env,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        conn = Connection(ours.detach())
        try:
            conn.send_bytes(
                pickle.dumps(
                    (self._model, self.tokenizer, self._kwargs, self._threads, dict(adapters or {})),
                    protocol=5,
                )
            )
            if not conn.poll(_START_TIMEOUT_S):
                raise EngineError(f"the engine process did not start within {_START_TIMEOUT_S:.0f} s")
            kind, payload = pickle.loads(conn.recv_bytes())
        except (EOFError, OSError) as exc:
            conn.close()
            process.kill()
            code = process.wait(5)
            raise EngineError(f"the engine process exited while starting (exit {code})") from exc
        except BaseException:
            conn.close()
            process.kill()
            process.wait(5)
            raise
        if kind == "error":
            conn.close()
            process.wait(10)
            raise payload
        if self._restarts is None:
            self._model = None  # the child has its copy; the caller's model is not kept alive here
        self._fast_path = bool(payload["fast_path"])
        self._conn, self._process = conn, process
        self._reader = threading.Thread(target=self._read, name="reinforge-engine-reader", daemon=True)
        self._failure = None
        self._serving.set()
        self._reader.start()

    def _replace(self, code: int | None) -> bool:
        """Start a child in place of the dead one (on the old reader's thread); False when the
        deaths make a crash loop, or the new child fails to start."""
        policy = self._restarts
        assert policy is not None
        if self._deaths.record(time.monotonic(), code, policy):
            codes = ", ".join(str(c) for c in self._deaths.codes)
            self._failure = EngineProcessDiedError(
                f"the engine process died {len(self._deaths)} times within "
                f"{policy.crash_loop_window_s:.0f} s (exit codes {codes}); it is not restarted again"
            )
            logger.error("%s", self._failure)
            return False
        time.sleep(policy.delay(len(self._deaths)))
        with self._start_lock:
            if self._stopping:
                return False
            self._kwargs["policy_version"] = self._version
            self._shared = _SharedWeights()  # the old buffer's name is gone: the child maps a new one
            adapters = {k: v for tensors in self._adapters.values() for k, v in tensors.items()}
            try:
                self._spawn(adapters)
            except BaseException as exc:
                self._failure = EngineProcessDiedError(f"the engine process could not be restarted: {exc}")
                logger.error("%s", self._failure)
                return False
        self.restarted += 1
        logger.warning(
            "the engine process was restarted (pid %s) at policy version %s", self.pid, self._version
        )
        return True

    def _remember(self, state: Mapping[str, torch.Tensor], version: int) -> None:
        """Apply a published update to the model a replacement child would start from (under the
        lock a replacement is started under, so it never pickles a half-applied update). An adapter
        named in an update is replaced whole."""
        named: dict[str, dict[str, torch.Tensor]] = {}
        for key, tensor in state.items():
            if key.startswith(LORA_PREFIX):
                adapter = key[len(LORA_PREFIX) :].partition("/")[0]
                named.setdefault(adapter, {})[key] = tensor.detach().clone()
        base = {k: v for k, v in state.items() if not k.startswith(LORA_PREFIX)}
        with self._start_lock:
            assert self._model is not None
            apply_state_dict(self._model, base)
            self._adapters.update(named)
            self._version = version

    async def _until_serving(self) -> None:
        """Wait while a replacement child starts (calls made meanwhile are served by it)."""
        if self._serving.is_set() or self._restarts is None:
            return
        deadline = time.monotonic() + _START_TIMEOUT_S
        while self._replacing and not self._stopping and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def stop(self, timeout: float = 30.0) -> None:
        """Stop the child; pending requests fail with EngineStoppedError."""
        self._stopping = True
        conn, process = self._conn, self._process
        if conn is not None and self._failure is None:
            with contextlib.suppress(EngineError):
                self._send(("stop",))
        if process is not None:
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(5)
        if conn is not None:
            conn.close()
        if self._reader is not None:
            self._reader.join(5)
        self._fail_all(EngineStoppedError("the engine stopped before the request finished"))

    def release_cache(self) -> None:
        """`Engine.release_cache` in the child (nothing to do while no child runs)."""
        if self._conn is not None and self._failure is None:
            with contextlib.suppress(EngineError):  # a dead child holds no cache
                self._send(("release",))

    # ---- asyncio API -----------------------------------------------------------------------------

    async def generate(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, adapter: str | None = None
    ) -> EngineOutput:
        """Generate one completion (with LoRA `adapter`, as `Engine.generate`); cancelling the
        awaiting task frees the request's slot."""
        await self._until_serving()
        call_id, call = self._open(prompt_ids, sampling, streaming=False, adapter=adapter)
        finished = False
        try:
            kind, payload = await call.queue.get()
            finished = True
            if kind == "error":
                raise payload
            assert isinstance(payload, EngineOutput)
            return payload
        finally:
            self._close(call_id, cancel=not finished)

    async def stream(
        self, prompt_ids: list[int], sampling: SamplingParams | None = None, adapter: str | None = None
    ) -> AsyncIterator[EngineDelta | EngineOutput]:
        """Deltas as the child produces them, then the EngineOutput (as `Engine.stream`)."""
        await self._until_serving()
        call_id, call = self._open(prompt_ids, sampling, streaming=True, adapter=adapter)
        finished = False
        try:
            while True:
                kind, payload = await call.queue.get()
                if kind == "error":
                    finished = True
                    raise payload
                if kind == "done":
                    finished = True
                    yield payload
                    return
                yield payload
        finally:
            self._close(call_id, cancel=not finished)

    async def load_weights(self, weights: WeightsSource, version: int) -> None:
        """Swap in new weights between steps, as `Engine.load_weights` (the child applies them).

        With an `EngineRestartPolicy`, an update cut off by the child's death is sent to its replacement."""
        if version < 0:
            raise InvalidRequestError("policy version must be >= 0")
        for tries_left in range(_PUBLISH_TRIES - 1, -1, -1):
            await self._until_serving()
            try:
                await self._load_weights_once(weights, version)
                break
            except EngineProcessDiedError:
                if self._restarts is None or not tries_left:
                    raise
        if self._restarts is None:
            self._version = version
            return
        state = (
            await asyncio.to_thread(read_state_dict, weights) if isinstance(weights, str | Path) else weights
        )
        await asyncio.to_thread(self._remember, state, version)

    async def _load_weights_once(self, weights: WeightsSource, version: int) -> None:
        call_id, call = self._register()
        fresh_file: str | None = None
        shared = False
        try:
            if isinstance(weights, (str, Path)):
                payload: Any = str(weights)
            elif self._publishing:
                # Another update is reading the shared buffer: this one travels in the message.
                payload = {name: tensor.detach().cpu() for name, tensor in weights.items()}
            else:
                self._publishing = shared = True
                payload, fresh_file = self._shared.write(weights)
            self._send(("weights", call_id, payload, version))
            kind, result = await call.queue.get()
        finally:
            if shared:
                self._publishing = False
            if fresh_file is not None:
                # The child has mapped it by now (or never will): the name is no longer needed.
                with contextlib.suppress(OSError):
                    os.unlink(fresh_file)
            self._close(call_id, cancel=False)
        if kind == "error":
            raise result

    # ---- plumbing --------------------------------------------------------------------------------

    def _register(self) -> tuple[int, _Call]:
        if self._conn is None and not self._stopping:
            self.start()
        call_id = next(self._ids)
        call = _Call(asyncio.get_running_loop())
        # Checked under the lock `_fail_all` takes after setting them: a call is either refused
        # here or failed there, never left waiting on a child that is gone.
        with self._calls_lock:
            if self._failure is not None:
                raise self._failure
            if self._stopping:
                raise EngineStoppedError("the engine is stopped")
            self._calls[call_id] = call
        return call_id, call

    def _open(
        self,
        prompt_ids: list[int],
        sampling: SamplingParams | None,
        *,
        streaming: bool,
        adapter: str | None = None,
    ) -> tuple[int, _Call]:
        call_id, call = self._register()
        try:
            self._post(("gen", call_id, list(prompt_ids), sampling or SamplingParams(), streaming, adapter))
        except BaseException:
            self._close(call_id, cancel=False)
            raise
        return call_id, call

    def _post(self, message: tuple[Any, ...]) -> None:
        """Queue a request; the requests a loop pass makes go to the child as one message (the
        step's released calls arrive together: one pickle, one write, one wake-up of the child's
        loop instead of one each). Any later `_send` flushes the queue first, so order is kept."""
        if self._conn is None:
            raise EngineStoppedError("the engine process is not running")
        with self._send_lock:
            self._outbox.append(message)
            first = len(self._outbox) == 1
        if first:
            asyncio.get_running_loop().call_soon(self._flush_requests)

    def _flush_requests(self) -> None:
        try:
            self._send(None)
        except EngineError as exc:  # `_send` raises the recorded failure when there is one
            # The reader fails every call when it sees the child gone; this covers a write that
            # failed first, so no caller waits on a request the child never got.
            self._fail_all(exc)

    def _close(self, call_id: int, *, cancel: bool) -> None:
        with self._calls_lock:
            known = self._calls.pop(call_id, None) is not None
        if cancel and known and self._failure is None and not self._stopping:
            with contextlib.suppress(OSError, ValueError, EngineError):
                self._send(("cancel", call_id))

    def _send(self, message: tuple[Any, ...] | None) -> None:
        """Send `message` (None: only what `_post` queued) after the queued requests, in one write."""
        conn = self._conn
        if conn is None:
            raise EngineStoppedError("the engine process is not running")
        try:
            with self._send_lock:
                batch = [*self._outbox, *([message] if message is not None else [])]
                self._outbox.clear()
                if not batch:
                    return
                conn.send_bytes(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))
        except (OSError, ValueError) as exc:
            raise self._failure or EngineProcessDiedError(f"the engine process is gone: {exc}") from exc

    def _read(self) -> None:
        """The reader thread: hands each batch of results to the callers' loops, one wake-up each."""
        conn = self._conn
        assert conn is not None
        try:
            while True:
                batch: list[tuple[int, str, Any]] = pickle.loads(conn.recv_bytes())
                with self._calls_lock:
                    found = [(self._calls.get(call_id), kind, payload) for call_id, kind, payload in batch]
                _dispatch([(call, kind, payload) for call, kind, payload in found if call is not None])
        except (EOFError, OSError):
            pass
        if not self._stopping:
            code = self._process.wait() if self._process is not None else None
            self._serving.clear()
            # Set before the pending calls fail, so a retry made at once waits for the replacement.
            self._replacing = self._restarts is not None
            self._failure = EngineProcessDiedError(f"the engine process exited unexpectedly (exit {code})")
            logger.error("%s", self._failure)
            self._fail_all(self._failure)
            if self._replacing:
                try:
                    self._replace(code)
                finally:
                    self._replacing = False
                conn.close()

    def _fail_all(self, error: EngineError) -> None:
        with self._calls_lock:
            calls = list(self._calls.values())
            self._calls.clear()
        _dispatch([(call, "error", error) for call in calls])


def _dispatch(results: list[tuple[_Call, str, Any]]) -> None:
    """Hand results to their callers' loops (from any thread): one wake-up per loop, not per result."""
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Call, str, Any]]] = {}
    for call, kind, payload in results:
        by_loop.setdefault(call.loop, []).append((call, kind, payload))
    for loop, items in by_loop.items():
        with contextlib.suppress(RuntimeError):  # that loop has closed
            loop.call_soon_threadsafe(_put_all, items)


def _put_all(items: list[tuple[_Call, str, Any]]) -> None:
    for call, kind, payload in items:
        call.queue.put_nowait((kind, payload))


# ---- the child -----------------------------------------------------------------------------------


def _serve(conn: Connection) -> None:
    """The child's main: an engine, an event loop for its calls, and a thread reading the pipe."""
    try:
        model, tokenizer, kwargs, threads, adapters = pickle.loads(conn.recv_bytes())
        torch.set_num_threads(threads)
        engine = Engine(model, tokenizer, **kwargs).start()
        if adapters:  # a replacement child: the adapters the dead one served
            asyncio.run(engine.load_weights(adapters, kwargs["policy_version"]))
    except EOFError:
        return
    except Exception as exc:
        conn.send_bytes(pickle.dumps(("error", _portable(exc))))
        return
    conn.send_bytes(pickle.dumps(("ready", {"fast_path": engine.uses_fast_path})))
    freeze_startup_heap()  # the model and its libraries: out of the collections its calls trigger
    asyncio.run(_ChildLoop(conn, engine).run())
    engine.stop()


class _ChildLoop:
    def __init__(self, conn: Connection, engine: Engine) -> None:
        self.conn, self.engine = conn, engine
        self.tasks: dict[int, asyncio.Task[None]] = {}
        self.outbox: list[tuple[int, str, Any]] = []
        self.done = asyncio.Event()
        self.shared = _SharedWeights()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        reader = threading.Thread(target=self._read, args=(loop,), name="engine-pipe-reader", daemon=True)
        reader.start()
        await self.done.wait()
        for task in self.tasks.values():
            task.cancel()

    def _read(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            while True:
                batch: list[tuple[Any, ...]] = pickle.loads(self.conn.recv_bytes())
                loop.call_soon_threadsafe(self._handle_all, batch)
                if any(message[0] == "stop" for message in batch):
                    return
        except (EOFError, OSError):  # the parent is gone
            loop.call_soon_threadsafe(self.done.set)
        except BaseException:
            # A message this child can't read (say, from a parent of another version): exit, so
            # the parent sees the pipe close and fails its calls, instead of both waiting forever.
            logger.exception("the engine process could not read a message from its parent")
            loop.call_soon_threadsafe(self.done.set)

    def _handle_all(self, batch: list[tuple[Any, ...]]) -> None:
        for message in batch:
            self._handle(message)

    def _handle(self, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "gen":
            _, call_id, prompt, sampling, streaming, adapter = message
            self._start(call_id, self._stream if streaming else self._generate, prompt, sampling, adapter)
        elif kind == "cancel":
            task = self.tasks.pop(message[1], None)
            if task is not None:
                task.cancel()
        elif kind == "weights":
            _, call_id, weights, version = message
            self._start(call_id, self._weights, weights, version)
        elif kind == "release":
            self.engine.release_cache()
        elif kind == "stop":
            self.done.set()

    def _start(self, call_id: int, work: Callable[..., Awaitable[None]], *args: Any) -> None:
        self.tasks[call_id] = asyncio.get_running_loop().create_task(self._answer(call_id, work, *args))

    async def _answer(self, call_id: int, work: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run one call's work; its failure goes back to the caller as its result. (The work's
        coroutine is made here, so a call cancelled before it starts leaves none unawaited.)"""
        try:
            await work(call_id, *args)
        except Exception as exc:
            self._post(call_id, "error", _portable(exc))
        finally:
            self.tasks.pop(call_id, None)

    async def _generate(
        self, call_id: int, prompt: list[int], sampling: SamplingParams, adapter: str | None
    ) -> None:
        self._post(call_id, "done", await self.engine.generate(prompt, sampling, adapter))

    async def _stream(
        self, call_id: int, prompt: list[int], sampling: SamplingParams, adapter: str | None
    ) -> None:
        async for item in self.engine.stream(prompt, sampling, adapter):
            self._post(call_id, "done" if isinstance(item, EngineOutput) else "delta", item)

    async def _weights(self, call_id: int, weights: Any, version: int) -> None:
        if isinstance(weights, _SharedPayload):
            weights = self.shared.read(weights)
        await self.engine.load_weights(weights, version)
        self._post(call_id, "ok", version)

    def _post(self, call_id: int, kind: str, payload: Any) -> None:
        """Queue a result; everything queued in one loop pass goes out as one message."""
        if not self.outbox:
            asyncio.get_running_loop().call_soon(self._flush)
        self.outbox.append((call_id, kind, payload))

    def _flush(self) -> None:
        batch, self.outbox = self.outbox, []
        with contextlib.suppress(OSError, ValueError):
            self.conn.send_bytes(pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL))


def _portable(exc: Exception) -> Exception:
    """The error itself when it survives pickling, else an EngineError that names it."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return EngineError(f"{type(exc).__name__}: {exc}")
    return exc


@dataclass(frozen=True)
class _SharedPayload:
    """A weight update left in the shared buffer at `path`; `layout` is sent when the buffer is new."""

    path: str
    layout: tuple[tuple[str, tuple[int, ...], torch.dtype, int], ...] | None


class _SharedWeights:
    """One file-backed shared buffer both processes map, holding a state dict's tensors.

    Publishing copies the tensors in (a memcpy) and sends only a small message, instead of
    pickling the whole state each step. The file lives in /dev/shm (memory) where there is one,
    and is unlinked as soon as the child has mapped it, so a crash leaves nothing behind.
    """

    def __init__(self) -> None:
        self._path = ""
        self._key: tuple[tuple[str, tuple[int, ...], torch.dtype], ...] = ()
        self._views: dict[str, torch.Tensor] = {}

    def write(self, state: Mapping[str, torch.Tensor]) -> tuple[_SharedPayload, str | None]:
        """(the message for the child, the path to unlink once it has answered, if the buffer is new)."""
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in state.items())
        fresh: str | None = None
        layout = None
        if key != self._key:
            offsets, total = [], 0
            for _, shape, dtype in key:
                offsets.append(total)
                total += -(-_nbytes(shape, dtype) // 64) * 64  # each tensor 64-byte aligned
            folder = "/dev/shm" if os.path.isdir("/dev/shm") else None
            handle, fresh = tempfile.mkstemp(prefix="reinforge-weights-", dir=folder)
            os.close(handle)
            layout = tuple(
                (n, shape, dtype, off) for (n, shape, dtype), off in zip(key, offsets, strict=True)
            )
            self._views = _map(fresh, layout, max(total, 1))
            self._key, self._path = key, fresh
        with torch.no_grad():
            for name, tensor in state.items():
                self._views[name].copy_(tensor.detach())
        return _SharedPayload(self._path, layout), fresh

    def read(self, payload: _SharedPayload) -> dict[str, torch.Tensor]:
        if payload.layout is not None:
            size = max((off + _nbytes(shape, dtype) for _, shape, dtype, off in payload.layout), default=1)
            self._views = _map(payload.path, payload.layout, size)
        return self._views


def _nbytes(shape: tuple[int, ...], dtype: torch.dtype) -> int:
    return math.prod(shape) * torch.empty((), dtype=dtype).element_size()


def _map(
    path: str, layout: tuple[tuple[str, tuple[int, ...], torch.dtype, int], ...], size: int
) -> dict[str, torch.Tensor]:
    flat = torch.from_file(path, shared=True, size=size, dtype=torch.uint8)
    return {
        name: flat[off : off + _nbytes(shape, dtype)].view(dtype).view(shape)
        for name, shape, dtype, off in layout
    }


_CHILD_ENTRY = (
    "import sys; from multiprocessing.connection import Connection; "
    "from reinforge.engine.process import _serve; _serve(Connection(int(sys.argv[1])))"
)
"""The child's whole program: the module's own copy of `_serve`, so the classes pickled across the
pipe are the same on both sides."""
