"""`reinforge train` and `reinforge sft`: the typer command functions that `reinforge/cli.py` registers."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from reinforge.cli_errors import exit_on_error


def train_command(
    config: Annotated[Path, typer.Argument(help="The run's TOML file (see docs/training.md).")],
    run_dir: Annotated[Path | None, typer.Option("--run-dir", help="Override [trainer] run_dir.")] = None,
    max_steps: Annotated[
        int | None, typer.Option("--max-steps", min=0, help="Override [trainer.schedule] max_steps.")
    ] = None,
    max_minutes: Annotated[
        float | None, typer.Option("--max-minutes", help="Override [trainer.schedule] max_minutes.")
    ] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Ignore checkpoints in the run folder.")] = False,
    nproc: Annotated[
        int | None,
        typer.Option(
            "--nproc", min=1, help="Data-parallel training processes (overrides [trainer.distributed] nproc)."
        ),
    ] = None,
) -> None:
    """Train an agent as the config file describes; resumes from the run folder's last checkpoint."""
    import torch

    from reinforge.training.distributed import (
        LAUNCHED_NPROC_ENV,
        is_follower,
        launch_local,
        launched_world,
    )
    from reinforge.training.run_config import load_dataset, load_model, load_run_config, resolve_agent
    from reinforge.training.trainer import Trainer

    schedule: dict[str, Any] = {}
    if max_steps is not None:
        schedule["max_steps"] = max_steps
    if max_minutes is not None:
        schedule["max_minutes"] = max_minutes
    overrides: dict[str, Any] = {"schedule": schedule}
    if run_dir is not None:
        overrides["run_dir"] = run_dir.resolve()
    if fresh:
        overrides["checkpoints"] = {"resume": False}
    if nproc is None and launched_world() is not None and os.environ.get(LAUNCHED_NPROC_ENV):
        nproc = int(os.environ[LAUNCHED_NPROC_ENV])  # started by `--nproc` below
    if nproc is not None:
        overrides["distributed"] = {"nproc": nproc}
    with exit_on_error():
        torch.set_num_threads(1)
        cfg = load_run_config(config, overrides)
        processes = cfg.trainer.distributed.nproc
        if processes > 1 and launched_world() is None:
            # Start the processes (torchrun's launcher) and let them run this same command.
            again = ["train", str(config.resolve())]
            again += ["--run-dir", str(run_dir.resolve())] if run_dir is not None else []
            again += ["--max-steps", str(max_steps)] if max_steps is not None else []
            again += ["--max-minutes", str(max_minutes)] if max_minutes is not None else []
            again += ["--fresh"] if fresh else []
            code = launch_local(processes, again)
            if code:
                typer.echo(f"error: a training process failed (exit code {code}); see above", err=True)
            raise typer.Exit(code)
        agent = resolve_agent(cfg)
        train = load_dataset(cfg.data.train, cfg.base_dir)
        val = load_dataset(cfg.data.val, cfg.base_dir) if cfg.data.val else []
        model, tokenizer = load_model(cfg)
        trainer = Trainer(
            model, tokenizer, algorithm=cfg.algorithm_config(), credit=cfg.credit, config=cfg.trainer
        )
        result = trainer.fit(agent, train, val)
    if is_follower():  # rank 0 reports the run
        return
    summary = "  ".join(f"{k}={v:.3f}" for k, v in result.val_after.items())
    typer.echo(f"trained {result.steps} steps (policy v{result.policy_version}); {summary}")
    typer.echo(f"run folder: {result.run_dir}")
    if cfg.report is not None:
        key = f"val/{cfg.report.metric}"
        before, after = result.val_before.get(key), result.val_after.get(key)
        shown = [f"{v:.3f}" if v is not None else "nan" for v in (before, after)]
        typer.echo(f"RESULT {cfg.report.name}_heldout before={shown[0]} after={shown[1]}")


def sft_command(
    config: Annotated[Path, typer.Argument(help="The run's TOML file, with a [warm_start] section.")],
    recollect: Annotated[
        bool,
        typer.Option(
            "--recollect",
            help="Record new traces even if the trace store has some, and train on the new ones alone "
            "(the earlier ones stay in the store).",
        ),
    ] = False,
    steps: Annotated[
        int | None, typer.Option("--steps", min=1, help="Override [warm_start.sft] steps.")
    ] = None,
) -> None:
    """Warm-start a model on the agent's recorded conversations (exact token ids from a store)."""
    import asyncio

    import torch

    from reinforge.training.run_config import load_run_config
    from reinforge.training.warm_start import build_warm_start

    with exit_on_error():
        torch.set_num_threads(1)
        cfg = load_run_config(config)
        if steps is not None and cfg.warm_start is not None:
            cfg.warm_start.sft.steps = steps

        window: list[float] = []

        def progress(step: int, loss: float) -> None:
            window.append(loss)
            if (
                step % 200 == 0
            ):  # one batch's loss swings with its lengths; the mean since the last line doesn't
                typer.echo(
                    f"sft step {step}: loss {sum(window) / len(window):.4f} (mean of the last {len(window)})"
                )
                window.clear()

        report = asyncio.run(build_warm_start(cfg, recollect=recollect, on_step=progress, log=typer.echo))
    typer.echo(
        f"trained {report.sft.steps} steps ({report.sft.precision}) on {report.examples} sequences "
        f"in {report.sft.seconds:.0f}s "
        f"(loss {report.sft.first_loss:.3f} -> {report.sft.last_loss:.3f})"
    )
    typer.echo(f"warm start saved to {report.out_dir}")
