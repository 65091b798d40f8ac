"""The `reinforge` command. Each layer owns its sub-commands in its own module; this file only
assembles them."""

from __future__ import annotations

import typer

from reinforge.demo.cli import demo_command
from reinforge.models.cli import models_app
from reinforge.runner.cli import runner_command
from reinforge.stack.cli import serve_command
from reinforge.store.cli import status_command
from reinforge.training.cli import sft_command, train_command

store_app = typer.Typer(no_args_is_help=True, help="Serve the store of a run, or inspect one.")
store_app.command("serve")(serve_command)
store_app.command("status")(status_command)

app = typer.Typer(
    no_args_is_help=True,
    help="Train any AI agent with reinforcement learning.",
    rich_markup_mode=None,  # help texts name TOML sections in brackets, which rich markup would eat
)
app.add_typer(store_app, name="store")
app.add_typer(models_app, name="models")
app.command("runner")(runner_command)
app.command("train")(train_command)
app.command("sft")(sft_command)
app.command("demo")(demo_command)

if __name__ == "__main__":
    app()
