"""A Weights & Biases run: offline by default (a `wandb/` folder in the run folder; `wandb sync`
uploads it later), one W&B run per run folder across resumes."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from reinforge.training.metric_sinks.base import Outcome, ParamValue, RunIds
from reinforge.training.metric_sinks.settings import WandbSettings

if TYPE_CHECKING:
    from wandb.sdk.wandb_run import Run

_EXIT_CODES: dict[Outcome, int] = {"finished": 0, "failed": 1, "killed": 255}  # 255: W&B's Ctrl-C code


class WandbSink:
    """Each record is one W&B history row at the trainer's step (records of one step merge)."""

    name = "wandb"

    def __init__(
        self, settings: WandbSettings, run_dir: Path, params: Mapping[str, ParamValue], *, continue_run: bool
    ) -> None:
        import wandb

        where = {"project": settings.project, "entity": settings.entity}
        ids = RunIds(run_dir)
        run_id = (ids.get(self.name, where) if continue_run else None) or uuid.uuid4().hex[:12]
        folder = run_dir / settings.dir if settings.dir is not None else run_dir
        folder.mkdir(parents=True, exist_ok=True)
        self._run: Run = wandb.init(
            project=settings.project,
            entity=settings.entity,
            name=settings.name or run_dir.resolve().name,
            group=settings.group,
            tags=settings.tags,
            dir=str(folder),
            id=run_id,
            # Online, "allow" continues the run when W&B has it; offline, each session is its own
            # file under wandb/, and `wandb sync` replays a run's files in order into one run.
            resume="allow",
            mode=settings.mode,
            job_type="train",
            # A library's run: leave any run the user's own code has open alone.
            reinit="create_new",
            # The trainer owns the terminal (its progress bar); W&B capturing it would garble both.
            settings=wandb.Settings(console="off", quiet=True),
        )
        # On a resume the settings may differ (more steps, a new time budget): the latest ones win.
        self._run.config.update(dict(params), allow_val_change=True)
        ids.put(self.name, where, run_id)

    @property
    def run_id(self) -> str:
        return self._run.id

    def log(self, step: int, values: Mapping[str, float]) -> None:
        self._run.log(dict(values), step=step)

    def close(self, outcome: Outcome = "finished") -> None:
        self._run.finish(exit_code=_EXIT_CODES[outcome])
