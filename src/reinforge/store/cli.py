"""`reinforge store serve` and `reinforge store status`.

`serve` puts a run folder's store on the network: it opens the database (SQLite in the run folder
unless `--db` says otherwise), makes or reuses the bearer token (`<run-dir>/store.token`, 0600), and
writes the URL it listens on to `<run-dir>/store.url`, so runners and `status` can find it. A gateway
is mounted at `/gateway` (runners finish attempts through it) in front of the backend the options
name, with its secret in `<run-dir>/gateway.secret` (0600); `serve` prints the runner command that joins.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated

import typer
import uvicorn
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from reinforge._event_loop import run_on_fast_loop
from reinforge._heap import freeze_startup_heap
from reinforge.errors import ReinforgeError
from reinforge.net.route_protocol import RouteTableProtocol
from reinforge.store.gateway_mount import (
    GATEWAY_MOUNT,
    GatewayBackendOptions,
    MountedGateway,
    gateway_builder,
)
from reinforge.store.http.auth import TOKEN_ENV, load_or_create_token, resolve_client_token, token_path
from reinforge.store.http.server import DEFAULT_MAX_BODY_BYTES, create_store_app
from reinforge.store.join import load_or_create_gateway_secret, runner_join_command, url_for_others
from reinforge.types import AttemptStatus, RolloutStatus, StoreCounters

URL_FILE_NAME = "store.url"
DEFAULT_PORT = 8765

store_app = typer.Typer(no_args_is_help=True, help="Serve the store of a run, or inspect one.")


def default_db_url(run_dir: Path) -> str:
    """SQLite in the run folder: the embedded default, durable across server restarts."""
    return f"sqlite:///{(run_dir / 'store.db').resolve()}"


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


@store_app.command("serve")
def serve(
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
        typer.Option("--model-dir", help="Gateway backend: the embedded engine on this model folder."),
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
    ] = "reinforge-policy",
    max_batch_size: Annotated[int, typer.Option("--max-batch-size", min=1, help="Embedded engine.")] = 64,
    max_seq_len: Annotated[int, typer.Option("--max-seq-len", min=16, help="Embedded engine.")] = 2048,
    log_level: Annotated[str, typer.Option("--log-level")] = "warning",
) -> None:
    """Serve the run's store over HTTP, with a gateway at /gateway, until interrupted (Ctrl-C / SIGTERM)."""
    from reinforge.store.factory import open_store

    try:
        options = GatewayBackendOptions.model_validate(
            {
                "model_dir": model_dir,
                "upstream": upstream,
                "upstream_model": upstream_model,
                "upstream_flavor": upstream_flavor,  # "vllm" or "sglang": the model refuses the rest
                "scripted": scripted,
                "model_name": model_name,
                "max_batch_size": max_batch_size,
                "max_seq_len": max_seq_len,
            }
        )
    except ValidationError as exc:
        messages = "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
        typer.echo(f"error: {messages}", err=True)
        raise typer.Exit(2) from None
    build_gateway = gateway_builder()
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
        gateway: MountedGateway | None = None
        closed = False

        async def close() -> None:
            """The gateway's last spans into the store, then the store; once."""
            nonlocal closed
            if closed:
                return
            closed = True
            if gateway is not None:
                with contextlib.suppress(Exception):
                    await gateway.close()
            await store.close()

        try:
            if build_gateway is not None:
                gateway = build_gateway(store, secret, options)
                await gateway.start()
            app = create_store_app(
                store,
                token,
                max_body_bytes=max_body_bytes,
                on_lease=gateway.leased if gateway is not None else None,
                run_dir=run_dir,
            )
            if gateway is not None:
                app.mount(GATEWAY_MOUNT, gateway.app)
            config = uvicorn.Config(
                app,
                log_level=log_level,
                access_log=False,
                lifespan="on",
                timeout_graceful_shutdown=5,
                http=RouteTableProtocol,
            )

            def on_shutdown() -> None:
                url_file.unlink(missing_ok=True)
                app.state.dashboard.close()  # open dashboard event streams end now, not at their cap

            server = _Server(config, on_shutdown=on_shutdown, on_closed=close)
            servers.append(server)
            # The store, its app and the gateway's backend live as long as the server: out of the
            # full collections its requests trigger (a pause of every call in flight).
            freeze_startup_heap()
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
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
                if gateway is not None:
                    typer.echo(f"  gateway:   {url}{GATEWAY_MOUNT} ({options.kind})")
                    typer.echo("  a runner joins with:")
                    typer.echo("    " + runner_join_command(joins_at, run_dir))
                else:
                    # Only `python -m reinforge.store.cli`: the `reinforge` command always hands a builder.
                    typer.echo("  gateway:   none (started outside the `reinforge` command)")
            await serving
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


def _counters_table(counters: StoreCounters) -> Table:
    table = Table(title="reinforge store", show_header=True)
    table.add_column("what")
    table.add_column("count", justify="right")
    for status in RolloutStatus:
        table.add_row(f"rollouts {status.value}", str(counters.rollouts_by_status.get(status, 0)))
    for attempt_status in AttemptStatus:
        count = counters.attempts_by_status.get(attempt_status, 0)
        table.add_row(f"attempts {attempt_status.value}", str(count))
    table.add_row("spans", str(counters.spans))
    table.add_row("resources versions", str(counters.resources_versions))
    latest = counters.latest_resources_version
    table.add_row("latest resources version", "-" if latest is None else str(latest))
    return table


@store_app.command("status")
def status(
    store_url: Annotated[
        str | None,
        typer.Option(
            "--store",
            help="http(s)://host:port of a store server, or a database URL. "
            "Default: the URL in <run-dir>/store.url.",
        ),
    ] = None,
    token: Annotated[
        str | None, typer.Option("--token", help="Default: $REINFORGE_STORE_TOKEN, the run dir's.")
    ] = None,
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Has store.url, store.token.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the counters as JSON.")] = False,
) -> None:
    """Print counts by status, spans and resources versions."""
    from reinforge.store.factory import open_store

    if store_url is None:
        if run_dir is None:
            typer.echo("error: give --store URL or --run-dir DIR", err=True)
            raise typer.Exit(2)
        try:
            store_url = (run_dir / URL_FILE_NAME).read_text(encoding="utf-8").strip()
        except FileNotFoundError:
            typer.echo(f"error: no store serves {run_dir} ({run_dir / URL_FILE_NAME} is missing)", err=True)
            raise typer.Exit(2) from None
    resolved_token = resolve_client_token(token, run_dir)
    url = store_url

    async def fetch() -> StoreCounters:
        store = await open_store(url, token=resolved_token)
        try:
            return await store.counters()
        finally:
            with contextlib.suppress(ReinforgeError):
                await store.close()

    result: list[StoreCounters] = []

    async def main() -> None:
        result.append(await fetch())

    try:
        run_on_fast_loop(main)
    except ReinforgeError as exc:
        typer.echo(f"error: {type(exc).__name__}: {exc}", err=True)
        raise typer.Exit(1) from exc
    counters = result[0]
    if as_json:
        typer.echo(counters.model_dump_json(indent=2))
    else:
        Console().print(_counters_table(counters))


if __name__ == "__main__":
    store_app()
