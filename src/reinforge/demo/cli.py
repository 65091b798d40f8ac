"""`reinforge demo`: the typer command function that `reinforge/cli.py` registers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reinforge.errors import ReinforgeError


def demo_command(
    run_dir: Annotated[
        Path, typer.Option("--run-dir", help="Where the run goes (resumed if present).")
    ] = Path("runs/demo"),
    rebuild_warm_start: Annotated[
        bool, typer.Option("--rebuild-warm-start", help="Train the warm start from scratch (minutes).")
    ] = False,
    minutes: Annotated[float, typer.Option("--minutes", help="RL wall-time budget.")] = 5.0,
    max_steps: Annotated[int, typer.Option("--max-steps", min=0)] = 400,
    val_size: Annotated[int, typer.Option("--val-size", min=1, help="Held-out tasks evaluated.")] = 200,
    credit_mode: Annotated[str, typer.Option("--credit-mode", help="merged or per_call.")] = "merged",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    runner_processes: Annotated[
        int, typer.Option("--runner-processes", min=0, help="Agents in N child processes (0: in-process).")
    ] = 2,
) -> None:
    """Train the calc agent through the store, gateway, engine and runners; print held-out success
    before and after."""
    from reinforge.demo.run import DemoSettings, run_demo

    try:
        settings = DemoSettings(
            run_dir=run_dir,
            rebuild_warm_start=rebuild_warm_start,
            minutes=minutes,
            max_steps=max_steps,
            val_size=val_size,
            credit_mode=credit_mode,  # type: ignore[arg-type]  # pydantic validates it
            seed=seed,
            runner_processes=runner_processes,
        )
        result = run_demo(settings)
    except (ReinforgeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(result.result_line())
