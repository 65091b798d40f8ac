"""The deprecated flat trainer settings: each still works through `TrainerConfig(...)`, `Trainer(...)`
and a TOML run file, lands in its group, warns with the new place, and given twice is an error."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest

from reinforge.training import OptimSettings, Trainer, TrainerConfig
from reinforge.training.flat_settings import MOVED, REMOVED_IN, FlatSettingConflictError
from reinforge.training.run_config import load_run_config

from .conftest import small_model

VALUES: dict[str, Any] = {
    "learning_rate": 1e-3,
    "lr_schedule": "cosine",
    "lr_final_ratio": 0.5,
    "weight_decay": 0.01,
    "max_grad_norm": 2.0,
    "epochs_per_batch": 2,
    "micro_batch_tokens": 4096,
    "lora": {"r": 4},
    "tasks_per_step": 3,
    "temperature": 0.7,
    "max_tokens": 32,
    "rollout_timeout_s": 30.0,
    "step_timeout_s": 90.0,
    "runners": 2,
    "runner_concurrency": 8,
    "runner_processes": 2,
    "runner_processes_nice": 5,
    "engine_max_batch_size": 16,
    "engine_max_seq_len": 256,
    "engine_process": True,
    "max_steps": 7,
    "max_minutes": 2.5,
    "val_every": 0,
    "val_greedy": False,
    "prefetch_rollouts": True,
    "overlap_rollouts": True,
    "checkpoint_every": 3,
    "keep_checkpoints": 4,
    "resume": False,
    "store_url": "memory://",
    "store_token": "secret-token",
}
"""A value for every flat setting, each unlike its default, so landing in the group is visible."""


def test_every_moved_setting_has_a_test_value() -> None:
    assert set(VALUES) == set(MOVED)


def grouped_value(config: TrainerConfig, flat: str) -> Any:
    group, field = MOVED[flat].split(".", 1)
    value = getattr(getattr(config, group), field)
    if flat == "lora":
        return {"r": value.r}
    if flat == "store_token":
        return value.get_secret_value()
    return value


def assert_warned_once_each(caught: list[warnings.WarningMessage], keys: list[str]) -> None:
    messages = sorted(str(w.message) for w in caught if w.category is DeprecationWarning)
    expected = sorted(
        f"`{k}` is deprecated; use `{MOVED[k]}` ([trainer.{MOVED[k].split('.')[0]}] "
        f"{MOVED[k].split('.', 1)[1]} in TOML); removed in {REMOVED_IN}"
        for k in keys
    )
    assert messages == expected


@pytest.mark.parametrize("flat", sorted(MOVED))
def test_trainer_config_puts_a_flat_setting_in_its_group(flat: str) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        config = TrainerConfig.model_validate({flat: VALUES[flat]})
    assert grouped_value(config, flat) == VALUES[flat]
    assert_warned_once_each(caught.list, [flat])
    with pytest.warns(DeprecationWarning, match=f"use `{MOVED[flat]}`"):
        assert TrainerConfig(**{flat: VALUES[flat]}).model_dump() == config.model_dump()


def test_the_warning_points_at_the_callers_line() -> None:
    with pytest.warns(DeprecationWarning) as caught:
        TrainerConfig(max_steps=3)
    assert caught.list[0].filename == __file__


def test_trainer_keywords_put_every_flat_setting_in_its_group(tokenizer: Any, tmp_path: Path) -> None:
    with pytest.warns(DeprecationWarning) as caught:
        trainer = Trainer(small_model(tokenizer), tokenizer, run_dir=tmp_path, **VALUES)
    for flat, value in VALUES.items():
        assert grouped_value(trainer.config, flat) == value, flat
    assert trainer.config.run_dir == tmp_path
    assert_warned_once_each(caught.list, list(VALUES))
    assert all(w.filename == __file__ for w in caught.list)


def test_flat_keywords_patch_the_given_config_and_keep_its_other_fields(
    tokenizer: Any, tmp_path: Path
) -> None:
    base = TrainerConfig(run_dir=tmp_path, optim=OptimSettings(weight_decay=0.2), schedule={"max_steps": 9})
    with pytest.warns(DeprecationWarning):
        trainer = Trainer(small_model(tokenizer), tokenizer, config=base, learning_rate=5e-3)
    assert trainer.config.optim.learning_rate == 5e-3 and trainer.config.optim.weight_decay == 0.2
    assert trainer.config.schedule.max_steps == 9


def toml_value(value: Any) -> str:
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {toml_value(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)  # numbers, strings and booleans are spelt the same in TOML


def write_run_file(folder: Path, trainer_lines: str) -> Path:
    path = folder / "run.toml"
    path.write_text(
        '[agent]\nentry = "agent:solve"\n[data]\ntrain = "train.jsonl"\n'
        f'[trainer]\nrun_dir = "out"\n{trainer_lines}'
    )
    return path


def test_a_run_file_puts_every_flat_setting_in_its_group(tmp_path: Path) -> None:
    lines = "".join(f"{k} = {toml_value(v)}\n" for k, v in VALUES.items())
    with pytest.warns(DeprecationWarning) as caught:
        config = load_run_config(write_run_file(tmp_path, lines))
    for flat, value in VALUES.items():
        assert grouped_value(config.trainer, flat) == value, flat
    assert_warned_once_each(caught.list, list(VALUES))


def test_a_command_line_override_of_the_group_wins_over_the_files_flat_setting(tmp_path: Path) -> None:
    path = write_run_file(tmp_path, "learning_rate = 0.1\nweight_decay = 0.3\n")
    with pytest.warns(DeprecationWarning):
        config = load_run_config(path, {"optim": {"learning_rate": 0.2}})
    assert config.trainer.optim.learning_rate == 0.2 and config.trainer.optim.weight_decay == 0.3


def test_a_setting_given_flat_and_grouped_is_an_error_everywhere(tokenizer: Any, tmp_path: Path) -> None:
    both = r"`learning_rate` and `optim.learning_rate` are both given; keep `optim.learning_rate` only"
    with pytest.raises(FlatSettingConflictError, match=both):
        TrainerConfig(learning_rate=1e-3, optim={"learning_rate": 2e-3})
    with pytest.raises(FlatSettingConflictError, match=both):
        TrainerConfig(learning_rate=1e-3, optim=OptimSettings(learning_rate=2e-3))
    with pytest.raises(FlatSettingConflictError, match=both):
        Trainer(small_model(tokenizer), tokenizer, learning_rate=1e-3, optim={"learning_rate": 2e-3})
    path = write_run_file(tmp_path, "learning_rate = 0.1\n[trainer.optim]\nlearning_rate = 0.2\n")
    with pytest.raises(FlatSettingConflictError, match=str(path)):
        load_run_config(path)
    with pytest.raises(FlatSettingConflictError, match=r"`runner_concurrency` and `runners.concurrency`"):
        TrainerConfig(runner_concurrency=4, runners={"concurrency": 8})


def test_other_fields_of_the_same_group_combine_and_the_group_itself_is_no_flat_setting() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TrainerConfig(runners={"count": 2}).runners.count == 2
    with pytest.warns(DeprecationWarning):
        config = TrainerConfig(optim={"weight_decay": 0.1}, learning_rate=1e-3, runners=3)
    assert (config.optim.weight_decay, config.optim.learning_rate, config.runners.count) == (0.1, 1e-3, 3)
