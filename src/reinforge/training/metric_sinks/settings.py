"""`[trainer.logging]`: where the trainer's metrics go besides `metrics.jsonl` (docs/logging.md)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

BACKENDS = ("jsonl", "tensorboard", "wandb", "mlflow")
"""Every backend name `backends` accepts; `jsonl` is always on (it is the run's record)."""

Backend = Literal["jsonl", "tensorboard", "wandb", "mlflow"]

_URI_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


class WandbSettings(BaseModel):
    """`[trainer.logging.wandb]`: a Weights & Biases run, offline (files only) unless told otherwise.

    Attributes:
        project / entity: where the run goes when synced (`wandb sync`) or logged online.
        mode: "offline" writes the run under `dir` and never touches the network; "online" streams it
            (needs `wandb login` or `WANDB_API_KEY`).
        name: the run's display name (None: the run folder's name).
        group / tags: W&B's grouping and tags for the run.
        dir: the folder W&B writes its `wandb/` folder into (None: the run folder; a relative path
            is inside the run folder).
    """

    model_config = ConfigDict(extra="forbid")

    project: str = "reinforge"
    entity: str | None = None
    mode: Literal["offline", "online"] = "offline"
    name: str | None = None
    group: str | None = None
    tags: list[str] = Field(default_factory=list)
    dir: Path | None = None


class MlflowSettings(BaseModel):
    """`[trainer.logging.mlflow]`: an MLflow run.

    Attributes:
        tracking_uri: where runs are stored, as a URI (None: a file store at `<run folder>/mlruns`;
            also `file:/abs/path`, a `sqlite:///...` database or an `http(s)://` tracking server).
        experiment: the experiment the run belongs to (created when missing).
        run_name: the run's name (None: the run folder's name).
        tags: tags set on the run.
    """

    model_config = ConfigDict(extra="forbid")

    tracking_uri: str | None = None
    experiment: str = "reinforge"
    run_name: str | None = None
    tags: dict[str, str] = Field(default_factory=dict)

    @field_validator("tracking_uri")
    @classmethod
    def _a_uri(cls, value: str | None) -> str | None:
        # A bare path would be relative to wherever the command happens to run, not the run file.
        if value is not None and not _URI_SCHEME.match(value):
            raise ValueError(
                f"tracking_uri is a URI (file:///abs/mlruns, sqlite:///abs/mlflow.db, http://host:5000), "
                f"got {value!r}; leave it out for a file store in the run folder"
            )
        return value


class LoggingSettings(BaseModel):
    """Where metrics go: `metrics.jsonl` always (the record a resume truncates and the dashboard and
    reward curve read), plus the listed backends, each given the same numbers for the same steps.

    Attributes:
        backends: any of "jsonl", "tensorboard", "wandb", "mlflow"; "jsonl" is implied.
        wandb: the W&B run's settings (only with "wandb" listed).
        mlflow: the MLflow run's settings (only with "mlflow" listed).
    """

    model_config = ConfigDict(extra="forbid")

    backends: list[Backend] = Field(default_factory=lambda: list[Backend](["jsonl", "tensorboard"]))
    wandb: WandbSettings = Field(default_factory=WandbSettings)
    mlflow: MlflowSettings = Field(default_factory=MlflowSettings)

    @field_validator("backends", mode="before")
    @classmethod
    def _known_backends(cls, value: Any) -> Any:
        """Name the valid backends (pydantic's own message would list them per entry, with noise)."""
        if isinstance(value, str):
            raise ValueError(f"backends is a list, e.g. [{value!r}]")
        if isinstance(value, list | tuple):
            unknown = [name for name in value if name not in BACKENDS]
            if unknown:
                raise ValueError(f"unknown logging backend(s) {unknown}; valid: {', '.join(BACKENDS)}")
            return ["jsonl", *dict.fromkeys(name for name in value if name != "jsonl")]
        return value

    @model_validator(mode="after")
    def _options_need_their_backend(self) -> LoggingSettings:
        """Settings for a backend that is not on would be silently ignored: refuse them instead.

        Compared with the defaults, not `model_fields_set`: a config dumped and validated again (as
        `Trainer` does with its overrides) has every field set.
        """
        changed = {"wandb": self.wandb != WandbSettings(), "mlflow": self.mlflow != MlflowSettings()}
        unused = [name for name, differs in changed.items() if differs and name not in self.backends]
        if unused:
            raise ValueError(
                f"settings given for {', '.join(unused)} but backends = {self.backends} does not list "
                f"{'it' if len(unused) == 1 else 'them'}"
            )
        return self

    @property
    def optional(self) -> list[str]:
        """The backends besides the JSONL, in the order given."""
        return [name for name in self.backends if name != "jsonl"]
