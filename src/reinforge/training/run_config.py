"""`reinforge train config.toml`: a whole run described in one TOML file.

    [model]      path = "builtin:calc-warm-start" | a save_pretrained folder
    [agent]      entry = "package.module:function"  (or command = "python agent.py", timeout_s = 60)
    [data]       train = "package.module:function" | "tasks.jsonl";  val = ... (optional)
    [algorithm]  name = "grpo", group_size = 8, ...        (reinforge.algorithms configs)
    [credit]     mode = "merged", assignment = "equal+air"  (reinforge.credit.CreditConfig)
    [trainer]    run_dir = "runs/calc", max_steps = 100, ... (reinforge.training.TrainerConfig)

Relative paths (run_dir, data files, model folder) are relative to the config file's folder, and that
folder is importable, so `entry = "my_agent:solve"` finds `my_agent.py` beside the config.
"""

from __future__ import annotations

import importlib
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reinforge.algorithms import Algorithm, algorithm_from_dict
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.runner import Agent, CommandAgent, load_agent
from reinforge.training.config import TrainerConfig

BUILTIN_CALC = "builtin:calc-warm-start"


class ModelSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: str = BUILTIN_CALC


class AgentSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    entry: str | None = None
    command: str | None = None
    timeout_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> AgentSection:
        if (self.entry is None) == (self.command is None):
            raise ValueError("[agent] needs exactly one of entry = 'module:function' or command = '...'")
        return self


class DataSection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train: str
    val: str | None = None


class RunConfig(BaseModel):
    """The parsed file; `base_dir` is where relative paths start."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSection = Field(default_factory=ModelSection)
    agent: AgentSection
    data: DataSection
    algorithm: dict[str, Any] = Field(default_factory=lambda: {"name": "grpo"})
    credit: CreditConfig = Field(default_factory=CreditConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    base_dir: Path = Path(".")

    def algorithm_config(self) -> Algorithm:
        return algorithm_from_dict(self.algorithm)


def load_run_config(path: Path, overrides: dict[str, Any] | None = None) -> RunConfig:
    """Parse and validate `path`; `overrides` replace `[trainer]` keys (from the command line)."""
    if not path.is_file():
        raise InvalidRequestError(f"config file {path} does not exist")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise InvalidRequestError(f"{path} is not valid TOML: {exc}") from exc
    base = path.resolve().parent
    trainer = {**raw.get("trainer", {}), **(overrides or {})}
    run_dir = Path(trainer.get("run_dir", "runs/latest"))
    trainer["run_dir"] = run_dir if run_dir.is_absolute() else base / run_dir
    raw["trainer"] = trainer
    try:
        config = RunConfig.model_validate({**raw, "base_dir": base})
        config.algorithm_config()
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid config {path}: {exc}") from exc
    return config


def resolve_agent(config: RunConfig) -> Agent | CommandAgent:
    section = config.agent
    if section.command is not None:
        return CommandAgent(section.command, timeout_s=section.timeout_s or 600.0, cwd=str(config.base_dir))
    assert section.entry is not None
    _importable(config.base_dir)
    agent = load_agent(section.entry)
    if section.timeout_s is not None:
        agent.timeout_s = section.timeout_s
    return agent


def load_dataset(spec: str, base_dir: Path) -> list[dict[str, Any]]:
    """Tasks from `module:attribute` (a list, or a function returning one) or a .jsonl / .json file."""
    path = Path(spec) if Path(spec).is_absolute() else base_dir / spec
    if spec.endswith((".jsonl", ".json")):
        if not path.is_file():
            raise InvalidRequestError(f"dataset file {path} does not exist")
        text = path.read_text(encoding="utf-8")
        items = (
            [json.loads(line) for line in text.splitlines() if line.strip()]
            if spec.endswith(".jsonl")
            else json.loads(text)
        )
    else:
        module_name, sep, attr = spec.partition(":")
        if not sep:
            raise InvalidRequestError(f"dataset {spec!r}: use 'module:function' or a .jsonl/.json file")
        _importable(base_dir)
        try:
            obj: Any = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            raise InvalidRequestError(f"cannot load dataset {spec!r}: {exc}") from exc
        items = obj() if callable(obj) else obj
    if not isinstance(items, list) or not all(isinstance(t, dict) for t in items):
        raise InvalidRequestError(f"dataset {spec!r} must be a list of JSON objects (dicts)")
    return items


def _importable(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
