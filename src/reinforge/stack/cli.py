"""`reinforge store serve`: a run folder's store on the network, with the gateway mounted.

It opens the database (SQLite in the run folder unless `--db` says otherwise), makes or reuses the
bearer token (`<run-dir>/store.token`, 0600), and writes the URL it listens on to
`<run-dir>/store.url`, so runners and `reinforge store status` can find it. The gateway is mounted at
`/gateway` (runners finish attempts through it) in front of the backend the options name, with its
secret in `<run-dir>/gateway.secret` (0600); `serve` prints the runner command that joins.

The server runs on this process's main loop (not `ServedStack`'s thread), so SIGTERM / Ctrl-C shut it
down gracefully: the URL file goes first, then requests end, then the gateway's last spans and the
store are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import uvicorn
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from reinforge._event_loop import run_on_fast_loop
from reinforge._heap import freeze_startup_heap
from reinforge.cli_errors import exit_on_error
from reinforge.errors import ReinforgeError
from reinforge.net.route_protocol import RouteTableProtocol
from reinforge.stack.app import GATEWAY_MOUNT, StackApp
from reinforge.stack.join import load_or_create_gateway_secret, runner_join_command, url_for_others
from reinforge.stack.settings import MODEL_NAME, EngineSettings
from reinforge.store.cli import URL_FILE_NAME, default_db_url
from reinforge.store.http.auth import TOKEN_ENV, load_or_create_token, token_path
from reinforge.store.http.server import DEFAULT_MAX_BODY_BYTES

DEFAULT_PORT = 8765
DEFAULT_MAX_SEQ_LEN = 2048
"""The served engine's default: longer than training's, since served agents' prompts are not bounded."""


def _without_password(db_url: str) -> str:
    """The database URL as it may be printed (a PostgreSQL password stays out of logs)."""
    try:
        return make_url(db_url).render_as_string(hide_password=True)
    except ArgumentError:
        return db_url


class _Server(uvicorn.Server):
    """uvicorn's server, with a hook at the start of a graceful shutdown.

    uvicorn re-raises SIGTERM/SIGINT once it has stopped, so code after `serve()` may never run;
    the URL file must go before that, so nobody is sent to a server that is going away, and the
    gateway's last spans and the store must be closed (`on_closed`) once requests have ended.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_shutdown: Callable[[], None],
        on_closed: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        super().__init__(config)
        self._on_shutdown = on_shutdown
        self._on_closed = on_closed

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self._on_shutdown()
        await super().shutdown(sockets)
        if self._on_closed is not None:
            await self._on_closed()


def engine_settings_from_options(
    *,
    model_dir: Path | None,
    upstream: str | None,
    upstream_model: str | None,
    upstream_flavor: str,
    scripted: Path | None,
    model_name: str,
    max_batch_size: int | None,
    max_seq_len: int | None,
) -> EngineSettings:
    """`serve`'s backend options as `EngineSettings` (at most one backend; none: LLM calls answer 503).
    Raises ValueError saying what does not fit."""
    options = (("--model-dir", model_dir), ("--upstream", upstream), ("--scripted", scripted))
    given = [name for name, value in options if value is not None]
    if len(given) > 1:
        raise ValueError(f"give at most one backend; got {' and '.join(given)}")
    settings: dict[str, Any] = {"model_name": model_name}
    if model_dir is not None:
        settings |= {"backend": "embedded", "model_dir": model_dir, "max_seq_len": DEFAULT_MAX_SEQ_LEN}
    elif upstream is not None:
        if not upstream_model:
            raise ValueError("--upstream needs --upstream-model (the model name that server serves)")
        if upstream_flavor not in ("vllm", "sglang"):
            raise ValueError(f"--upstream-flavor is vllm or sglang, not {upstream_flavor!r}")
        settings |= {"backend": upstream_flavor, "url": upstream, "served_model": upstream_model}
    elif scripted is not None:
        settings |= {"backend": "scripted", "scripted": scripted}
    else:
        settings["backend"] = "none"
    if max_batch_size is not None:
        settings["max_batch_size"] = max_batch_size
    if max_seq_len is not None:
        settings["max_seq_len"] = max_seq_len
    return EngineSettings.model_validate(settings)


def serve_command(
    run_dir: Annotated[Path, typer.Option("--run-dir", help="Run folder: token, URL file and default DB.")],
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="Store URL: sqlite:///path.db, postgresql://..., memory://. "
            "Default: sqlite in the run folder.",
        ),
    ] = None,
    host: Annotated[str, typer.Option("--host", help="Interface; 0.0.0.0 exposes the store.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="0: any free port.", min=0, max=65535)] = DEFAULT_PORT,
    public_url: Annotated[
        str | None,
        typer.Option("--public-url", help="The URL runners on other machines use (default: from --host)."),
    ] = None,
    max_body_bytes: Annotated[int, typer.Option("--max-body-bytes", min=1024)] = DEFAULT_MAX_BODY_BYTES,
    model_dir: Annotated[
        Path | None,
        typer.Option(
            "--model-dir",
            help="Gateway backend: the embedded engine on this model folder, a packaged model's name "
            "(`reinforge models list`), a .gguf file or a hub id.",
        ),
    ] = None,
    upstream: Annotated[
        str | None, typer.Option("--upstream", help="Gateway backend: a vLLM/SGLang server's root URL.")
    ] = None,
    upstream_model: Annotated[
        str | None, typer.Option("--upstream-model", help="The model name the upstream server serves.")
    ] = None,
    upstream_flavor: Annotated[str, typer.Option("--upstream-flavor", help="vllm or sglang.")] = "vllm",
    scripted: Annotated[
        Path | None, typer.Option("--scripted", help="Gateway backend: a JSON list of replies, in turn.")
    ] = None,
    model_name: Annotated[
        str, typer.Option("--model-name", help="The model name agents' calls see.")
    ] = MODEL_NAME,
    max_batch_size: Annotated[
        int | None, typer.Option("--max-batch-size", min=1, help="Embedded engine (default 64).")
    ] = None,
    max_seq_len: Annotated[
        int | None,
        typer.Option("--max-seq-len", min=16, help=f"Embedded engine (default {DEFAULT_MAX_SEQ_LEN})."),
    ] = None,
    log_level: Annotated[str, typer.Option("--log-level")] = "warning",
) -> None:
    """Serve the run's store over HTTP, with a gateway at /gateway, until interrupted (Ctrl-C / SIGTERM)."""
    from reinforge.stack.backends import Serving, build_serving
    from reinforge.store.factory import open_store

    with exit_on_error(ValueError):
        settings = engine_settings_from_options(
            model_dir=model_dir,
            upstream=upstream,
            upstream_model=upstream_model,
            upstream_flavor=upstream_flavor,
            scripted=scripted,
            model_name=model_name,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    db_url = db or default_db_url(run_dir)
    token = load_or_create_token(run_dir)
    secret = load_or_create_gateway_secret(run_dir)
    url_file = run_dir / URL_FILE_NAME
    url_file.unlink(missing_ok=True)  # a stale URL would point clients at a dead server

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        typer.echo(f"error: cannot listen on {host}:{port}: {exc.strerror}; pick another --port", err=True)
        raise typer.Exit(2) from exc
    bound_port = sock.getsockname()[1]
    url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::') else host}:{bound_port}"
    joins_at = (public_url or url_for_others(host, bound_port)).rstrip("/")
    failure: list[str] = []
    servers: list[_Server] = []

    async def main() -> None:
        try:
            store = await open_store(db_url)
        except Exception as exc:  # any driver's error: shown, not a traceback
            failure.append(f"cannot open the store {_without_password(db_url)}: {exc}")
            return
        serving: Serving | None = None
        stack: StackApp | None = None
        closed = False

        async def close() -> None:
            """The gateway's last spans into the store, the backend, then the store; once."""
            nonlocal closed
            if closed:
                return
            closed = True
            if stack is not None:
                with contextlib.suppress(Exception):
                    await stack.gateway.close()
            if serving is not None:
                with contextlib.suppress(Exception):
                    await serving.aclose()
            await store.close()

        try:
            serving = build_serving(settings)
            await serving.start()
            stack = StackApp(
                store,
                serving.backend,
                store_token=token,
                gateway_secret=secret,
                run_dir=run_dir,
                max_body_bytes=max_body_bytes,
            )
            config = uvicorn.Config(
                stack.app,
                log_level=log_level,
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=5,
                http=RouteTableProtocol,
            )

            def on_shutdown() -> None:
                url_file.unlink(missing_ok=True)
                if stack is not None:
                    stack.close_dashboard()  # open dashboard event streams end now, not at their cap

            server = _Server(config, on_shutdown=on_shutdown, on_closed=close)
            servers.append(server)
            # The store, its app and the gateway's backend live as long as the server: out of the
            # full collections its requests trigger (a pause of every call in flight).
            freeze_startup_heap()
            served = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not served.done():
                await asyncio.sleep(0.02)
            if server.started:
                # Written only once the store is open and the socket accepts: its presence means "ready".
                tmp = url_file.with_suffix(".tmp")
                tmp.write_text(url + "\n", encoding="utf-8")
                os.replace(tmp, url_file)
                token_source = (
                    f"${TOKEN_ENV}" if os.environ.get(TOKEN_ENV, "").strip() else token_path(run_dir)
                )
                typer.echo(f"reinforge store serving {_without_password(db_url)} on {url}")
                typer.echo(f"  token:     {token_source}")
                typer.echo(f"  dashboard: {url}/dashboard#token={token}")
                typer.echo(f"  gateway:   {url}{GATEWAY_MOUNT} ({settings.describe()})")
                typer.echo("  a runner joins with:")
                typer.echo("    " + runner_join_command(joins_at, run_dir))
            await served
        except ReinforgeError as exc:
            failure.append(str(exc))
        finally:
            await close()

    run_on_fast_loop(main)
    if failure:
        typer.echo(f"error: {failure[0]}", err=True)
        raise typer.Exit(1)
    if not servers or not servers[0].started:
        shown = _without_password(db_url)
        typer.echo(f"error: the store server did not start (database {shown}); see the log above", err=True)
        raise typer.Exit(1)
