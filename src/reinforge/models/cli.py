"""`reinforge models`: list, prepare, locate and remove the converted models in the cache."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Annotated

import typer

from reinforge.errors import ReinforgeError
from reinforge.models.cache import cached_folder, folder_size, list_cached, models_dir, remove_cached
from reinforge.models.registry import PACKAGED_MODELS
from reinforge.models.resolve import resolve_model

models_app = typer.Typer(
    no_args_is_help=True,
    help="Models from pip packages or GGUF files, converted once into a cache of Hugging Face folders.",
)

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
Name = Annotated[str, typer.Argument(help="A packaged model's name (see `reinforge models list`).")]


def _fail(message: str) -> typer.Exit:
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(1)


def _unknown(name: str) -> typer.Exit:
    known = ", ".join(PACKAGED_MODELS)
    return _fail(f"no model {name!r} in the cache {models_dir()} (packaged models: {known})")


def _size(num_bytes: int) -> str:
    return f"{num_bytes / 1e6:.0f} MB"


@models_app.command("list")
def list_command() -> None:
    """The packaged models (whether installed and cached) and every other folder in the cache."""
    typer.echo(f"cache: {models_dir()}")
    for model in PACKAGED_MODELS.values():
        folder = cached_folder(model.name)
        installed = importlib.util.find_spec(model.module) is not None
        if folder is not None:
            where = f"cached  {folder}  {_size(folder_size(folder))}"
        elif installed:
            where = "not cached (reinforge models prepare " + model.name + ")"
        else:
            where = f"package missing (pip install 'reinforge[{model.extra}]')"
        typer.echo(f"{model.name}  [{model.family}, {model.license}]  {where}")
    for cached in list_cached():
        if cached.name not in PACKAGED_MODELS:
            typer.echo(
                f"{cached.name}  [from a GGUF file]  cached  {cached.folder}  {_size(cached.size_bytes)}"
            )


@models_app.command("prepare")
def prepare_command(
    source: Annotated[
        str, typer.Argument(help="A packaged model's name, a .gguf file, a model folder or a hub id.")
    ],
) -> None:
    """Convert the model into the cache (once) and print the folder to load it from."""
    path = Path(source).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise _fail(f"{path} has no config.json (not a Hugging Face model folder)")
        typer.echo(str(path))
        return
    if path.suffix != ".gguf" and source not in PACKAGED_MODELS:
        if not _HUB_ID.fullmatch(source):
            raise _unknown(source)
        typer.echo(_download(source))
        return
    try:
        typer.echo(resolve_model(source))
    except ReinforgeError as exc:
        raise _fail(str(exc)) from None


def _download(hub_id: str) -> str:
    from huggingface_hub import snapshot_download

    try:
        return str(snapshot_download(hub_id))
    except Exception as exc:  # offline, unknown repo, gated repo: the hub's own message says which
        raise _fail(f"cannot download {hub_id!r} from the model hub: {type(exc).__name__}: {exc}") from None


@models_app.command("path")
def path_command(name: Name) -> None:
    """Print a cached model's folder (without converting: `prepare` does that)."""
    folder = cached_folder(name)
    if folder is None:
        if name in PACKAGED_MODELS:
            raise _fail(f"{name!r} is not in the cache yet: run `reinforge models prepare {name}`")
        raise _unknown(name)
    typer.echo(str(folder))


@models_app.command("remove")
def remove_command(name: Name) -> None:
    """Delete a model's folder from the cache (the package or GGUF file it came from stays)."""
    try:
        removed = remove_cached(name)
    except ReinforgeError as exc:
        raise _fail(str(exc)) from None
    if not removed:
        raise _unknown(name)
    typer.echo(f"removed {models_dir() / name}")
