"""The sink contract every metrics backend meets, and what the backends share: which values are
metrics, the run's settings as flat parameters, and the backend run ids kept in the run folder."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel

ParamValue = str | int | float | bool | None
Outcome = Literal["finished", "failed", "killed"]
"""How the fit ended, as a backend marks its run: it returned, it raised, or it was interrupted."""

RUN_IDS_FILE = "logging_runs.json"
"""In the run folder: each backend's run id, so a resumed training run continues the same backend run."""


class MetricSink(Protocol):
    """One backend's view of a run: a step's values in, closed at the end of the fit.

    `values` are a JSONL record's numbers (no booleans, no strings): a step's training metrics, the
    validation numbers at the step they ran after (step 0: before training; `final: 1`: after it).
    """

    name: str

    def log(self, step: int, values: Mapping[str, float]) -> None: ...

    def close(self, outcome: Outcome = "finished") -> None: ...


def numeric_values(values: Mapping[str, Any]) -> dict[str, float]:
    """The values a backend charts: ints and floats; booleans and strings stay in the JSONL only."""
    return {
        key: float(value)
        for key, value in values.items()
        if isinstance(value, int | float) and not isinstance(value, bool)
    }


def flat_params(groups: Mapping[str, BaseModel]) -> dict[str, ParamValue]:
    """Settings as one level of `group.field.subfield` keys (what W&B config and MLflow params show);
    lists become their JSON text, secrets their mask."""
    out: dict[str, ParamValue] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for key, inner in value.items():
                walk(f"{prefix}.{key}", inner)
        elif isinstance(value, list):
            out[prefix] = json.dumps(value)
        else:
            out[prefix] = value

    for name, model in groups.items():
        walk(name, model.model_dump(mode="json"))
    return out


class RunIds:
    """`logging_runs.json`: per backend, the id of its run and what identifies where it lives.

    A backend's run is continued only when the place it lives (project, tracking URI) is unchanged:
    an id from another W&B project or MLflow store names nothing there.
    """

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / RUN_IDS_FILE

    def get(self, backend: str, where: Mapping[str, Any]) -> str | None:
        entry = self._read().get(backend)
        if not isinstance(entry, dict) or entry.get("where") != dict(where):
            return None
        run_id = entry.get("run_id")
        return run_id if isinstance(run_id, str) else None

    def put(self, backend: str, where: Mapping[str, Any], run_id: str) -> None:
        entries = self._read()
        entries[backend] = {"run_id": run_id, "where": dict(where)}
        self.path.write_text(json.dumps(entries, indent=2) + "\n", encoding="utf-8")

    def _read(self) -> dict[str, Any]:
        if not self.path.is_file():
            return {}
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            return {}  # a torn write: start new backend runs rather than refuse to train
        return data if isinstance(data, dict) else {}
