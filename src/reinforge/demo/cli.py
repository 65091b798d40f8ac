"""`reinforge demo`: the typer command function that `reinforge/cli.py` registers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from reinforge.errors import ReinforgeError


def demo_command(
    run_dir: Annotated[
        Path | None,
        typer.Option(
            "--run-dir", help="Where the run goes (resumed if present); runs/demo or runs/real-demo."
        ),
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            help="Train the OpenAI-SDK calculator agent on this real model instead (a packaged model's name "
            "such as smollm2-135m-instruct, a GGUF file, a model folder or a hub id).",
        ),
    ] = None,
    rebuild_warm_start: Annotated[
        bool, typer.Option("--rebuild-warm-start", help="Train the warm start from scratch (minutes).")
    ] = False,
    minutes: Annotated[
        float | None, typer.Option("--minutes", help="RL wall-time budget (5; 10 with --model).")
    ] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=0, help="400; 60 with --model.")] = None,
    val_size: Annotated[int, typer.Option("--val-size", min=1, help="Held-out tasks evaluated.")] = 200,
    credit_mode: Annotated[str, typer.Option("--credit-mode", help="merged or per_call.")] = "merged",
    seed: Annotated[int, typer.Option("--seed")] = 0,
    runner_processes: Annotated[
        int | None,
        typer.Option(
            "--runner-processes",
            min=0,
            help="Agents in N child processes (0: in-process); 2, or 1 with --model.",
        ),
    ] = None,
) -> None:
    """Train the calc agent through the store, gateway, engine and runners; print held-out success
    before and after."""
    given = {
        key: value
        for key, value in {
            "run_dir": run_dir,
            "minutes": minutes,
            "max_steps": max_steps,
            "runner_processes": runner_processes,
        }.items()
        if value is not None
    }
    try:
        if model is not None:
            line = _real_demo(model, val_size=val_size, seed=seed, **given)
        else:
            line = _tiny_demo(
                rebuild_warm_start=rebuild_warm_start,
                val_size=val_size,
                credit_mode=credit_mode,
                seed=seed,
                **given,
            )
    except (ReinforgeError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    typer.echo(line)


def _tiny_demo(**settings: object) -> str:
    from reinforge.demo.run import DemoSettings, run_demo

    return run_demo(DemoSettings.model_validate(settings)).result_line()


def _real_demo(model: str, **settings: object) -> str:
    from reinforge.demo.real.run import RealDemoSettings, run_real_demo

    return run_real_demo(RealDemoSettings.model_validate({"model": model, **settings})).result_line()
