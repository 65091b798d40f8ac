"""`reinforge store status`: counts by status, spans and resources versions of a run's store.

`reinforge store serve`, which serves the store with the gateway mounted, is assembled above the
gateway (`reinforge.stack.cli`); `reinforge.cli` registers both under `reinforge store`.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from reinforge._event_loop import run_on_fast_loop
from reinforge.errors import ReinforgeError
from reinforge.store.http.auth import resolve_client_token
from reinforge.types import AttemptStatus, RolloutStatus, StoreCounters

URL_FILE_NAME = "store.url"
"""In the run folder while a server serves its store: the URL it listens on."""


def default_db_url(run_dir: Path) -> str:
    """SQLite in the run folder: the embedded default, durable across server restarts."""
    return f"sqlite:///{(run_dir / 'store.db').resolve()}"


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


def status_command(
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
