"""An MLflow run: a file store under the run folder by default, one MLflow run per run folder across
resumes."""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from reinforge.errors import InvalidRequestError
from reinforge.training.metric_sinks.base import Outcome, ParamValue, RunIds
from reinforge.training.metric_sinks.settings import MlflowSettings

_logger = logging.getLogger(__name__)

_BATCH_METRICS = 1000  # MLflow's most metrics per log_batch call
_BATCH_PARAMS = 100  # and params
_REFUSED_CHARACTERS = re.compile(r"[^/\w.\- :]")  # what MLflow refuses in a metric or param name


def mlflow_name(key: str) -> str:
    """`key` as MLflow accepts it: characters it refuses become `_` (reinforge's own keys have none)."""
    return _REFUSED_CHARACTERS.sub("_", key)


def default_tracking_uri(run_dir: Path) -> str:
    return (run_dir.resolve() / "mlruns").as_uri()


class MlflowSink:
    """A step's values go in one `log_batch` call, at the trainer's step."""

    name = "mlflow"

    def __init__(
        self, settings: MlflowSettings, run_dir: Path, params: Mapping[str, ParamValue], *, continue_run: bool
    ) -> None:
        from mlflow.tracking import MlflowClient

        uri = settings.tracking_uri or default_tracking_uri(run_dir)
        if uri.startswith("file:"):
            # MLflow 3 keeps its file store in maintenance mode behind this switch; the user asked for
            # a file store (or took the default), so it is switched on unless they set it themselves.
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._client = MlflowClient(tracking_uri=uri)
        experiment = self._client.get_experiment_by_name(settings.experiment)
        if experiment is None:
            experiment_id = self._client.create_experiment(settings.experiment)
        elif experiment.lifecycle_stage != "active":
            raise InvalidRequestError(
                f"MLflow experiment {settings.experiment!r} at {uri} is deleted: restore it "
                "(mlflow experiments restore) or set [trainer.logging.mlflow] experiment to another name"
            )
        else:
            experiment_id = experiment.experiment_id
        where = {"tracking_uri": uri, "experiment": settings.experiment}
        ids = RunIds(run_dir)
        previous = ids.get(self.name, where) if continue_run else None
        run_id = self._continue(previous) if previous else None
        if run_id is None:
            run = self._client.create_run(
                experiment_id, run_name=settings.run_name or run_dir.resolve().name, tags=settings.tags
            )
            run_id = run.info.run_id
        self.run_id: str = run_id
        ids.put(self.name, where, run_id)
        self._log_new_params(params)

    def _continue(self, run_id: str) -> str | None:
        """The stored run, marked running again; None when it no longer exists there."""
        from mlflow.exceptions import MlflowException

        try:
            run = self._client.get_run(run_id)
        except MlflowException:
            return None
        if run.info.lifecycle_stage != "active":
            return None
        self._client.update_run(run_id, status="RUNNING")
        return run_id

    def _log_new_params(self, params: Mapping[str, ParamValue]) -> None:
        """MLflow params can't change once logged: a resumed run logs only the ones it lacks."""
        from mlflow.entities import Param

        existing = self._client.get_run(self.run_id).data.params
        wanted = {mlflow_name(key): str(value) for key, value in params.items()}
        changed = sorted(key for key, value in wanted.items() if key in existing and existing[key] != value)
        if changed:
            _logger.warning(
                "MLflow run %s keeps the first values of %s (MLflow params can't change once logged)",
                self.run_id,
                ", ".join(changed),
            )
        new = [Param(key, value) for key, value in wanted.items() if key not in existing]
        for start in range(0, len(new), _BATCH_PARAMS):
            self._client.log_batch(self.run_id, params=new[start : start + _BATCH_PARAMS])

    def log(self, step: int, values: Mapping[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics: list[Any] = [Metric(mlflow_name(key), value, now, step) for key, value in values.items()]
        for start in range(0, len(metrics), _BATCH_METRICS):
            self._client.log_batch(self.run_id, metrics=metrics[start : start + _BATCH_METRICS])

    def close(self, outcome: Outcome = "finished") -> None:
        self._client.set_terminated(self.run_id, outcome.upper())  # FINISHED, FAILED, KILLED
