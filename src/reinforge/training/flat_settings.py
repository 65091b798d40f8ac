"""The trainer's flat settings, deprecated since they were grouped: each still works until `REMOVED_IN`,
put in its group with a `DeprecationWarning` that names the new place, so a script or a run file
written for the flat names keeps running for one minor version and says what to change.

`upgrade_flat_settings` is the one place this happens; `TrainerConfig` (and through it TOML run files)
and `Trainer(**overrides)` all call it.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from reinforge.errors import ReinforgeError

REMOVED_IN = "0.2"
"""The release that drops the flat names: one minor version after 0.1, which grouped them."""

MOVED: dict[str, str] = {
    "learning_rate": "optim.learning_rate",
    "lr_schedule": "optim.lr_schedule",
    "lr_final_ratio": "optim.lr_final_ratio",
    "weight_decay": "optim.weight_decay",
    "max_grad_norm": "optim.max_grad_norm",
    "epochs_per_batch": "optim.epochs_per_batch",
    "micro_batch_tokens": "optim.micro_batch_tokens",
    "lora": "optim.lora",
    "tasks_per_step": "rollouts.tasks_per_step",
    "temperature": "rollouts.temperature",
    "max_tokens": "rollouts.max_tokens",
    "rollout_timeout_s": "rollouts.timeout_s",
    "step_timeout_s": "rollouts.step_timeout_s",
    "runners": "runners.count",
    "runner_concurrency": "runners.concurrency",
    "runner_processes": "runners.processes",
    "runner_processes_nice": "runners.processes_nice",
    "engine_max_batch_size": "engine.max_batch_size",
    "engine_max_seq_len": "engine.max_seq_len",
    "engine_process": "engine.process",
    "max_steps": "schedule.max_steps",
    "max_minutes": "schedule.max_minutes",
    "val_every": "schedule.val_every",
    "val_greedy": "schedule.val_greedy",
    "prefetch_rollouts": "schedule.prefetch_rollouts",
    "overlap_rollouts": "schedule.overlap_rollouts",
    "checkpoint_every": "checkpoints.every",
    "keep_checkpoints": "checkpoints.keep",
    "resume": "checkpoints.resume",
    "store_url": "store.url",
    "store_token": "store.token",
}
"""Each flat setting of the ungrouped `TrainerConfig` and the group field it is now."""


class FlatSettingConflictError(ReinforgeError, TypeError):
    """A setting given both by its deprecated flat name and in its group: which was meant is unknown.

    A TypeError, as Python's own "got multiple values for argument" is, so that pydantic passes it
    through unchanged and every entry point raises this same type."""

    http_status = 400


def deprecation_message(flat: str) -> str:
    group, field = MOVED[flat].split(".", 1)
    return (
        f"`{flat}` is deprecated; use `{MOVED[flat]}` ([trainer.{group}] {field} in TOML); "
        f"removed in {REMOVED_IN}"
    )


def _is_flat(key: str, value: Any) -> bool:
    # `runners` is both: a count when flat, the group when a table, dict or object.
    if key == "runners":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return key in MOVED


def _group_fields(group: Any) -> tuple[dict[str, Any], set[str]]:
    """A group as given (absent, a dict, or a settings object) as a dict, and the fields it sets."""
    if group is None:
        return {}, set()
    if isinstance(group, BaseModel):
        return group.model_dump(), set(group.model_fields_set)
    if isinstance(group, Mapping):
        return dict(group), set(group)
    return {}, {"*"}  # not a group at all: any flat setting for it conflicts


def upgrade_flat_settings(settings: Mapping[str, Any], *, stacklevel: int = 2) -> dict[str, Any]:
    """`settings` with every flat setting moved into its group, one DeprecationWarning for each.

    Raises FlatSettingConflictError when the group already sets that field (or is not a group)."""
    out = dict(settings)
    flat = {key: out.pop(key) for key in settings if _is_flat(key, settings[key])}
    for key, value in flat.items():
        group, field = MOVED[key].split(".", 1)
        fields, given = _group_fields(out.get(group))
        if field in given or "*" in given:
            raise FlatSettingConflictError(
                f"`{key}` and `{MOVED[key]}` are both given; keep `{MOVED[key]}` only "
                f"(`{key}` is its deprecated flat name)"
            )
        out[group] = {**fields, field: value}
        warnings.warn(deprecation_message(key), DeprecationWarning, stacklevel=stacklevel + 1)
    return out


__all__ = ["MOVED", "REMOVED_IN", "FlatSettingConflictError", "deprecation_message", "upgrade_flat_settings"]
