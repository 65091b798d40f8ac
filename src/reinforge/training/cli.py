"""`reinforge train config.toml` and `reinforge demo`: typer command functions that cli.py registers."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from reinforge.errors import ReinforgeError


def train_command(
    config: Annotated[Path, typer.Argument(help="The run's TOML file (see docs/training.md).")],
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Override [trainer] run_dir.")] = None,
    max_steps: Annotated[int | None, typer.Option("--max-steps", min=0, help="Override max_steps.")] = None,
    max_minutes: Annotated[float | None, typer.Option("--max-minutes", help="Override max_minutes.")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore checkpoints in the run folder.")] = False,
) -> None:
    """Train an agent as the config file describes; resumes from the run folder's last checkpoint."""
    import torch

    from reinforge.training.run_config import BUILTIN_CALC, load_dataset, load_run_config, resolve_agent
    from reinforge.training.trainer import Trainer

    overrides: dict[str, Any] = {}
    if run_dir is not None:
        overrides["run_dir"] = run_dir.resolve()
    if max_steps is not None:
        overrides["max_steps"] = max_steps
    if max_minutes is not None:
        overrides["max_minutes"] = max_minutes
    if fresh:
        overrides["resume"] = False
    try:
        torch.set_num_threads(1)
        cfg = load_run_config(config, overrides)
        agent = resolve_agent(cfg)
        train = load_dataset(cfg.data.train, cfg.base_dir)
        val = load_dataset(cfg.data.val, cfg.base_dir) if cfg.data.val else []
        if cfg.model.path == BUILTIN_CALC:
            from reinforge.demo.warm_start import load_warm_start

            model, tokenizer = load_warm_start()
            trainer = Trainer(
                model, tokenizer, algorithm=cfg.algorithm_config(), credit=cfg.credit, config=cfg.trainer
            )
        else:
            path = Path(cfg.model.path)
            trainer = Trainer(
                path if path.is_absolute() else cfg.base_dir / path,
                algorithm=cfg.algorithm_config(),
                credit=cfg.credit,
                config=cfg.trainer,
            )
        result = trainer.fit(agent, train, val)
    except ReinforgeError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    summary = "  ".join(f"{k}={v:.3f}" for k, v in result.val_after.items())
    typer.echo(f"trained {result.steps} steps (policy v{result.policy_version}); {summary}")
    typer.echo(f"run folder: {result.run_dir}")


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
    """Train the calc agent through the full spine; print held-out success before and after."""
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
