"""The command line's one way to refuse: `error: <message>` on stderr and exit status 2, so a script
can tell input the command refused from a crash (status 1, with a traceback)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import typer
from pydantic import ValidationError

from reinforge.errors import ReinforgeError


@contextmanager
def exit_on_error(*errors: type[Exception]) -> Iterator[None]:
    """Turn `errors` (default: `ReinforgeError`) raised inside the block into that refusal; a
    pydantic `ValidationError` among them reads as its messages, without pydantic's layout."""
    caught = errors or (ReinforgeError,)
    try:
        yield
    except caught as exc:
        typer.echo(f"error: {_message(exc)}", err=True)
        raise typer.Exit(2) from exc


def _message(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        return "; ".join(str(e["msg"]).removeprefix("Value error, ") for e in exc.errors())
    return str(exc)
