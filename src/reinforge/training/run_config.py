"""`reinforge train config.toml`: a whole run described in one TOML file.

    [model]      path = "builtin:calc-warm-start" | a save_pretrained folder | "module:function"
    [agent]      entry = "package.module:function"  (or command = "python agent.py", timeout_s = 60)
    [data]       train = "package.module:function" | "tasks.jsonl";  val = ... (optional)
    [algorithm]  name = "grpo", group_size = 8, ...        (reinforge.algorithms configs)
    [credit]     mode = "merged", assignment = "equal+air"  (reinforge.credit.CreditConfig)
    [trainer]    run_dir = "runs/calc", seed = 0, progress = true  (reinforge.training.TrainerConfig)
    [trainer.optim]        learning_rate = 5e-4, lr_schedule = "linear", ...
    [trainer.rollouts]     tasks_per_step = 16, max_tokens = 48, ...
    [trainer.runners]      processes = 2, concurrency = 128, ...
    [trainer.engine]       max_batch_size = 128, ...
    [trainer.schedule]     max_steps = 400, max_minutes = 5, val_every = 0, ...
    [trainer.checkpoints]  every = 5, keep = 2, resume = true
    [trainer.store]        url = "http://host:port", token = "..."

Relative paths (run_dir, data files, model folder) are relative to the config file's folder, and that
folder is importable, so `entry = "my_agent:solve"` finds `my_agent.py` beside the config.
"""

from __future__ import annotations

import importlib
import json
import re
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reinforge.algorithms import Algorithm, algorithm_from_dict
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.runner import Agent, CommandAgent, load_agent
from reinforge.training.config import TrainerConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BUILTIN_CALC = "builtin:calc-warm-start"
BUILTIN_MODELS = {BUILTIN_CALC: "reinforge.demo.warm_start:load_warm_start"}
"""Short names for the models reinforge ships, each a `module:function` loader: found by import at
run time, so training/ does not depend on the package that ships them."""

_LOADER = re.compile(r"[\w.]+:[\w.]+")


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
    trainer = dict(raw.get("trainer", {}))
    for key, value in (overrides or {}).items():  # a group's override keeps the file's other fields
        group = trainer.get(key)
        trainer[key] = {**group, **value} if isinstance(value, dict) and isinstance(group, dict) else value
    run_dir = Path(trainer.get("run_dir", "runs/latest"))
    trainer["run_dir"] = run_dir if run_dir.is_absolute() else base / run_dir
    raw["trainer"] = trainer
    try:
        config = RunConfig.model_validate({**raw, "base_dir": base})
        config.algorithm_config()
    except ValidationError as exc:
        raise InvalidRequestError(f"invalid config {path}: {exc}") from exc
    return config


def load_model(config: RunConfig) -> tuple[PreTrainedModel | Path, PreTrainedTokenizerBase | None]:
    """`[model] path`: a `save_pretrained` folder (its tokenizer loads with it), or a `module:function`
    (or a `BUILTIN_MODELS` name) whose function returns `(model, tokenizer)`."""
    spec = BUILTIN_MODELS.get(config.model.path, config.model.path)
    path = Path(spec) if Path(spec).is_absolute() else config.base_dir / spec
    if path.exists() or not _LOADER.fullmatch(spec):
        return path, None
    _importable(config.base_dir)
    module_name, _, attr = spec.partition(":")
    try:
        loader = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequestError(f"cannot load model {config.model.path!r}: {exc}") from exc
    loaded = loader()
    if not (isinstance(loaded, tuple) and len(loaded) == 2):
        raise InvalidRequestError(f"model loader {spec!r} must return (model, tokenizer)")
    model, tokenizer = loaded
    return model, tokenizer


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
