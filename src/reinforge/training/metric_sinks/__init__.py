"""Metrics backends beside `metrics.jsonl`: TensorBoard, Weights & Biases, MLflow (docs/logging.md).

Each is a `MetricSink` opened by `open_sinks` from `[trainer.logging]`. The backends' packages load
only when listed: W&B and MLflow are the `reinforge[wandb]` and `reinforge[mlflow]` extras.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from reinforge.errors import InvalidRequestError
from reinforge.training.metric_sinks.base import MetricSink, Outcome, ParamValue, numeric_values
from reinforge.training.metric_sinks.settings import BACKENDS, LoggingSettings, MlflowSettings, WandbSettings

PACKAGES = {
    "tensorboard": ("tensorboardX", "reinforge"),
    "wandb": ("wandb", "reinforge[wandb]"),
    "mlflow": ("mlflow-skinny", "reinforge[mlflow]"),
}
"""Per optional backend: the package it needs and what to install for it."""


def open_sinks(
    settings: LoggingSettings, run_dir: Path, params: Mapping[str, ParamValue], *, continue_runs: bool
) -> list[MetricSink]:
    """The listed backends, started (continuing the run folder's backend runs when `continue_runs`).

    A backend that can't start is an error now, before any training: its package missing (named
    with the extra to install), or its own refusal (a W&B login, an MLflow store).
    """
    sinks: list[MetricSink] = []
    try:
        for name in settings.optional:
            sinks.append(_open(name, settings, run_dir, params, continue_runs))
    except BaseException:
        for sink in sinks:
            sink.close()
        raise
    return sinks


def _open(
    name: str, settings: LoggingSettings, run_dir: Path, params: Mapping[str, ParamValue], continue_runs: bool
) -> MetricSink:
    try:
        if name == "tensorboard":
            from reinforge.training.metric_sinks.tensorboard_sink import TensorBoardSink

            return TensorBoardSink(run_dir)
        if name == "wandb":
            from reinforge.training.metric_sinks.wandb_sink import WandbSink

            return WandbSink(settings.wandb, run_dir, params, continue_run=continue_runs)
        from reinforge.training.metric_sinks.mlflow_sink import MlflowSink

        return MlflowSink(settings.mlflow, run_dir, params, continue_run=continue_runs)
    except ImportError as exc:
        package, extra = PACKAGES[name]
        raise InvalidRequestError(
            f"logging backend {name!r} needs the {package} package: pip install '{extra}' ({exc})"
        ) from exc
    except InvalidRequestError:
        raise
    except Exception as exc:
        raise InvalidRequestError(f"logging backend {name!r} could not start: {exc}") from exc


__all__ = [
    "BACKENDS",
    "PACKAGES",
    "LoggingSettings",
    "MetricSink",
    "MlflowSettings",
    "Outcome",
    "WandbSettings",
    "numeric_values",
    "open_sinks",
]
