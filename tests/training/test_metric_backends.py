"""Metrics backends beside metrics.jsonl: a W&B offline run and an MLflow file store get the JSONL's
numbers, read back through each one's own format (the .wandb record files, MlflowClient)."""

from __future__ import annotations

import json
import logging
import math
import shutil
import struct
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from reinforge.algorithms import GRPO
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.training import Trainer, TrainerConfig
from reinforge.training.metric_sinks import LoggingSettings
from reinforge.training.metric_sinks.base import RUN_IDS_FILE
from reinforge.training.metrics import MetricsLog
from reinforge.training.run_config import load_run_config

from .conftest import parity_agent, small_model

TRAIN = [{"task_id": f"t{i}", "question": f"{i}+{i}*2"} for i in range(20)]
VAL = [{"task_id": f"v{i}", "question": f"{i}*3-1"} for i in range(4)]
BOTH = {"backends": ["wandb", "mlflow"], "wandb": {"project": "tests"}, "mlflow": {"experiment": "tests"}}

Table = dict[int, dict[str, float]]


@pytest.fixture(autouse=True)
def _wandb_stays_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No login, no network, nothing written to the home folder."""
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    for name in ("WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR", "WANDB_ARTIFACT_DIR"):
        monkeypatch.setenv(name, str(tmp_path / "wandb-home" / name.lower()))


# --- reading each backend back ----------------------------------------------------------------------


def jsonl_table(run_dir: Path) -> Table:
    """Per step, every number the JSONL has (a step's records merged: a step and its final validation)."""
    table: Table = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        step = record.pop("step")
        numbers = {
            k: float(v) for k, v in record.items() if isinstance(v, int | float) and not isinstance(v, bool)
        }
        table.setdefault(step, {}).update(numbers)
    return table


def wandb_records(path: Path) -> Iterator[Any]:
    """The records of a .wandb file: W&B's framing of LevelDB's log format (a 7-byte ':W&B' header, then
    32 KiB blocks of CRC-checked chunks) around `wandb_internal_pb2.Record` protos."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:7]) == (b":W&B", 0xBEE1, 0)
    position, pending = 7, b""
    while position + 7 <= len(data):
        left_in_block = 32768 - position % 32768
        crc, length, kind = struct.unpack("<IHB", data[position : position + 7])
        if left_in_block < 7 or (length, kind) == (0, 0):  # block padding
            position += left_in_block
            continue
        chunk = data[position + 7 : position + 7 + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) == crc, f"corrupt chunk at {position} in {path}"
        position += 7 + length
        pending += chunk
        if kind in (1, 4):  # a full record, or the last chunk of one
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_table(run_dir: Path) -> tuple[set[str], Table]:
    """The run ids of the offline sessions under run_dir/wandb and their history rows per step; a
    later session's row of a step replaces an earlier one (what the resumed run logged again)."""
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))  # folder names start with the time
    ids: set[str] = set()
    table: Table = {}
    for path in files:
        rows: Table = {}
        for record in wandb_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                ids.add(record.run.run_id)
            elif kind == "history":
                # An item names its key in `key` or, as a path, in `nested_key` (W&B uses either).
                items = {
                    item.key or ".".join(item.nested_key): json.loads(item.value_json)
                    for item in record.history.item
                }
                step = items.pop("_step")
                rows.setdefault(step, {}).update(
                    {k: float(v) for k, v in items.items() if k not in ("_timestamp", "_runtime")}
                )
        table.update(rows)
    return ids, table


def wandb_config(run_dir: Path) -> dict[str, Any]:
    """The W&B run's config as its sessions left it (a later update of a key wins)."""
    config: dict[str, Any] = {}
    for path in sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb")):
        for record in wandb_records(path):
            if record.WhichOneof("record_type") == "config":
                config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return config


def mlflow_table(run_dir: Path, experiment: str = "tests") -> tuple[Any, Table]:
    """The experiment's only run and, per step, each metric's last value logged there."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(run_dir.resolve() / "mlruns").as_uri())
    found = client.get_experiment_by_name(experiment)
    assert found is not None
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, f"one MLflow run per run folder, found {len(runs)}"
    run = runs[0]
    table: Table = {}
    for key in run.data.metrics:
        for metric in sorted(client.get_metric_history(run.info.run_id, key), key=lambda m: m.timestamp):
            table.setdefault(metric.step, {})[key] = metric.value
    return run, table


def assert_same(expected: Table, got: Table, backend: str) -> None:
    assert sorted(got) == sorted(expected), f"{backend} steps differ"
    for step, values in expected.items():
        assert sorted(got[step]) == sorted(values), f"{backend} keys differ at step {step}"
        for key, value in values.items():
            seen = got[step][key]
            assert seen == value or (math.isnan(seen) and math.isnan(value)), (
                backend,
                step,
                key,
                seen,
                value,
            )


# --- a real training run -----------------------------------------------------------------------------


def fit(tokenizer: Any, run_dir: Path, max_steps: int) -> None:
    config = TrainerConfig(
        run_dir=run_dir,
        progress=False,
        optim={"learning_rate": 1e-2},
        rollouts={"tasks_per_step": 2, "max_tokens": 6},
        runners={"concurrency": 16},
        engine={"max_batch_size": 16, "max_seq_len": 128},
        schedule={"max_steps": max_steps, "val_every": 2, "val_greedy": False},
        checkpoints={"every": 1},
        logging=BOTH,
    )
    trainer = Trainer(
        small_model(tokenizer), tokenizer, algorithm=GRPO(group_size=2), credit=CreditConfig(), config=config
    )
    trainer.fit(parity_agent, TRAIN, VAL)


def test_a_fit_and_its_resume_log_the_jsonl_numbers_to_one_wandb_run_and_one_mlflow_run(
    tokenizer: Any, tmp_path: Path
) -> None:
    fit(tokenizer, tmp_path, max_steps=3)
    fit(tokenizer, tmp_path, max_steps=4)  # resumes at the step-3 checkpoint

    expected = jsonl_table(tmp_path)
    # before training, 4 steps (validation after step 2), the "after" validation at steps 3 and 4
    assert sorted(expected) == [0, 1, 2, 3, 4]
    assert {"val/success", "val/reward"} <= set(expected[0]) and "val/success" in expected[2]
    assert expected[4]["final"] == 1.0 and expected[3]["final"] == 1.0
    assert len(expected[1]) > 20  # train/*, update/*, credit/*, time/* ...

    ids, logged = wandb_table(tmp_path)
    run_ids = json.loads((tmp_path / RUN_IDS_FILE).read_text())
    assert ids == {run_ids["wandb"]["run_id"]}  # two sessions, one W&B run
    assert len(list((tmp_path / "wandb").glob("offline-run-*"))) == 2
    assert_same(expected, logged, "wandb")
    config = wandb_config(tmp_path)
    assert config["trainer.schedule.max_steps"] == 4 and config["algorithm.group_size"] == 2  # the resume's

    run, logged = mlflow_table(tmp_path)
    assert run.info.run_id == run_ids["mlflow"]["run_id"] and run.info.status == "FINISHED"
    assert run.data.params["trainer.schedule.max_steps"] == "3"  # MLflow params keep their first value
    assert run.data.params["algorithm.name"] == "grpo" and run.data.params["trainer.store.token"] == "None"
    assert_same(expected, logged, "mlflow")
    assert not (tmp_path / "tensorboard").exists()  # listed backends replace the default list


# --- MetricsLog with the backends, without training ------------------------------------------------


def test_a_resume_that_redoes_steps_overwrites_them_and_a_fresh_start_opens_new_runs(tmp_path: Path) -> None:
    settings = LoggingSettings.model_validate(BOTH)
    log = MetricsLog(tmp_path, settings, continue_runs=False)
    for step in range(1, 4):
        log.log(step, {"train/reward": step / 10, "tokens": 7 * step, "flag": True, "note": "x"})
    log.close()

    # Killed after step 3 but checkpointed at step 2: step 3 is done again, with other numbers.
    log = MetricsLog(tmp_path, settings, continue_runs=True)
    log.truncate_after(2)
    log.log(3, {"train/reward": 0.9, "tokens": 99, "loss": float("nan")})
    log.log(4, {"train/reward": 1.0, "tokens": 100, "loss": 0.5})
    log.close()
    expected = jsonl_table(tmp_path)
    assert expected[3] == {"train/reward": 0.9, "tokens": 99.0, "loss": expected[3]["loss"]}
    first_ids, logged = wandb_table(tmp_path)
    assert len(first_ids) == 1
    assert_same(expected, logged, "wandb")
    _, logged = mlflow_table(tmp_path)
    assert_same(expected, logged, "mlflow")  # the redone step's later values win

    # A fresh start (no checkpoint): new backend runs, not more steps on the old ones.
    log = MetricsLog(tmp_path, settings, continue_runs=False)
    log.truncate_after(-1)
    log.log(1, {"train/reward": 0.5})
    log.close()
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("tests")
    assert experiment is not None and len(client.search_runs([experiment.experiment_id])) == 2
    ids = json.loads((tmp_path / RUN_IDS_FILE).read_text())
    assert ids["wandb"]["run_id"] not in first_ids


def test_a_backend_failing_mid_run_is_warned_about_once_and_the_jsonl_keeps_every_step(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MetricsLog(tmp_path, LoggingSettings(backends=["mlflow"]), continue_runs=False)
    log.log(1, {"train/reward": 0.1})
    shutil.rmtree(tmp_path / "mlruns")  # the store vanishes under the run
    with caplog.at_level(logging.WARNING, logger="reinforge.training.metrics"):
        for step in range(2, 5):
            log.log(step, {"train/reward": step / 10})
        log.close()
    assert [r["step"] for r in log.records()] == [1, 2, 3, 4]
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed to log" in m for m in messages) == 1, messages
    assert log.failures == {"mlflow": 4}  # three steps and the close


def test_backend_runs_closed_while_the_fit_raises_are_marked_failed(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, LoggingSettings.model_validate(BOTH), continue_runs=False)
    log.log(1, {"train/reward": 0.1})
    with pytest.raises(RuntimeError, match="engine died"):
        try:
            raise RuntimeError("engine died")
        finally:  # as Trainer.fit closes its log
            log.close()
    run, _ = mlflow_table(tmp_path)
    assert run.info.status == "FAILED"
    (path,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    exits = [r.exit.exit_code for r in wandb_records(path) if r.WhichOneof("record_type") == "exit"]
    assert exits == [1]


def test_a_listed_backend_without_its_package_is_an_error_naming_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what `import wandb` does when it is not installed
    with pytest.raises(InvalidRequestError, match=r"pip install 'reinforge\[wandb\]'"):
        MetricsLog(tmp_path, LoggingSettings(backends=["wandb"]))


def test_a_backend_that_refuses_to_start_is_an_error_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc with a W&B key either
    online = LoggingSettings.model_validate({"backends": ["wandb"], "wandb": {"mode": "online"}})
    with pytest.raises(InvalidRequestError, match="logging backend 'wandb' could not start: No API key"):
        MetricsLog(tmp_path / "run", online)


def test_logging_settings_refuse_what_they_would_ignore() -> None:
    with pytest.raises(
        ValueError, match=r"unknown logging backend.*'comet'.*valid: jsonl, tensorboard, wandb, mlflow"
    ):
        LoggingSettings.model_validate({"backends": ["wandb", "comet"]})
    with pytest.raises(ValueError, match="settings given for mlflow but backends"):
        LoggingSettings.model_validate({"backends": ["wandb"], "mlflow": {"experiment": "x"}})
    with pytest.raises(ValueError, match="tracking_uri is a URI"):
        LoggingSettings.model_validate({"backends": ["mlflow"], "mlflow": {"tracking_uri": "mlruns"}})
    settings = LoggingSettings.model_validate({"backends": ["mlflow", "jsonl", "mlflow"]})
    assert settings.backends == ["jsonl", "mlflow"] and settings.optional == ["mlflow"]
    assert LoggingSettings().backends == ["jsonl", "tensorboard"]  # what a run did before the setting


def test_a_run_file_sets_logging_under_trainer_and_refuses_a_top_level_logging_table(tmp_path: Path) -> None:
    head = '[agent]\nentry = "a:b"\n[data]\ntrain = "t.jsonl"\n'
    good = tmp_path / "good.toml"
    good.write_text(
        head + '[trainer.logging]\nbackends = ["wandb"]\n[trainer.logging.wandb]\nproject = "calc"\n'
    )
    config = load_run_config(good)
    assert (
        config.trainer.logging.backends == ["jsonl", "wandb"]
        and config.trainer.logging.wandb.project == "calc"
    )
    bad = tmp_path / "bad.toml"
    bad.write_text(head + '[logging]\nbackends = ["wandb"]\n')
    with pytest.raises(InvalidRequestError, match=r"write \[logging\] as \[trainer.logging\]"):
        load_run_config(bad)
