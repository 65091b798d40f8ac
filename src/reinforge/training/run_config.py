"""`reinforge train config.toml`: a whole run described in one TOML file.

    [model]      path = "builtin:calc-warm-start" | a save_pretrained folder | "module:function"
                 | a packaged model "smollm2-135m-instruct" | a "file.gguf" (both via the models cache)
                 | a model hub id "org/name" (when no folder of that name exists)
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
    [trainer.logging]      backends = ["tensorboard", "wandb", "mlflow"]  (+ .wandb / .mlflow tables)
    [report]       name = "sql", metric = "success"  (the closing RESULT line: ReportSection)
    [warm_start]   base = "module:function", policy = "module:function", out = "warm-start", ...
                   (what `reinforge sft` records and trains on: WarmStartSection)

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
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from reinforge.algorithms import Algorithm, algorithm_from_dict
from reinforge.credit import CreditConfig
from reinforge.errors import InvalidRequestError
from reinforge.models import PACKAGED_MODELS, resolve_model
from reinforge.runner import Agent, CommandAgent, load_agent
from reinforge.training.config import TrainerConfig
from reinforge.training.flat_settings import FlatSettingConflictError, upgrade_flat_settings
from reinforge.training.sft import SftConfig

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

BUILTIN_CALC = "builtin:calc-warm-start"
BUILTIN_MODELS = {BUILTIN_CALC: "reinforge.demo.warm_start:load_warm_start"}
"""Short names for the models reinforge ships, each a `module:function` loader: found by import at
run time, so training/ does not depend on the package that ships them."""

_LOADER = re.compile(r"[\w.]+:[\w.]+")
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""A model hub id, `org/name`: what a model name is when no folder of that name exists."""


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


class WarmStartSection(BaseModel):
    """`reinforge sft`: record the agent against a policy that behaves, then train a base model on the
    recorded tokens; `[model] path` then names `out` for the RL run.

    Attributes:
        base: the untrained model (a folder, a packaged model's name, a `.gguf` file or a
            `module:function` returning `(model, tokenizer)`);
            its tokenizer encodes the recorded conversations.
        policy: `module:function` taking a `GenerationRequest` and returning a reply (text, or a
            `ScriptedReply` / dict with tool calls): the scripted policy the agent runs against.
            None: `store` already holds recorded runs (from any earlier run) and is used as it is.
        store: where the traces are recorded (a SQLite file path, or a store URL).
        tasks: how many training tasks to record (None: all of `[data] train`).
        out: where the trained warm start is saved (a `save_pretrained` folder).
        min_reward: train only on rollouts whose reward reaches this (None: all of them, which is
            what a designed mix of right and wrong behaviour needs).
        agents: train only the calls of these agent names (None: every call).
        rewrite: `module:function` rewriting one conversation's text each time SFT draws it: it takes
            the text segments (context and trained, in order) and a `random.Random`, and returns as
            many segments (`reinforge.training.sft_rewrite`), for example fresh entity names, so
            that the model learns to copy names rather than learn them by heart. None: as recorded.
        concurrency / processes / max_tokens: how the collection runs the agent (`processes` > 0:
            in that many runner children, each `concurrency` at once).
        compact_json: the policy's tool calls are written `{"name":"f","arguments":{...}}` (True, as
            reinforge's own chat template renders them) or `{"name": "f", "arguments": ...}` (False,
            as the default tool form of a template without tools renders a call in the prompt, e.g.
            SmolLM2's demonstrations); arguments given as a string go in as they are either way.
        sft: the supervised run's settings.
    """

    model_config = ConfigDict(extra="forbid")

    base: str
    policy: str | None = None
    store: str = "warm-start-traces.db"
    tasks: int | None = Field(default=None, ge=1)
    out: str = "warm-start"
    min_reward: float | None = None
    agents: list[str] | None = None
    rewrite: str | None = None
    concurrency: int = Field(default=64, ge=1)
    processes: int = Field(default=0, ge=0)
    max_tokens: int = Field(default=96, ge=1)
    compact_json: bool = True
    sft: SftConfig = Field(default_factory=SftConfig)

    def store_url(self, base_dir: Path) -> str:
        if "://" in self.store:
            return self.store
        path = Path(self.store) if Path(self.store).is_absolute() else base_dir / self.store
        return f"sqlite:///{path.resolve()}"

    def out_dir(self, base_dir: Path) -> Path:
        path = Path(self.out)
        return path if path.is_absolute() else base_dir / path


class ReportSection(BaseModel):
    """`[report]`: the line `reinforge train` ends with, `RESULT <name>_heldout before=<a> after=<b>`.

    `metric` is the held-out number compared: "success" (share of rewards of 1) or "reward" (the
    mean reward, for graded rewards such as an F1); the greedy variants read the greedy validation.
    """

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[\w-]+$")
    metric: Literal["success", "reward", "greedy_success", "greedy_reward"] = "success"


class RunConfig(BaseModel):
    """The parsed file; `base_dir` is where relative paths start."""

    model_config = ConfigDict(extra="forbid")

    model: ModelSection = Field(default_factory=ModelSection)
    agent: AgentSection
    data: DataSection
    algorithm: dict[str, Any] = Field(default_factory=lambda: {"name": "grpo"})
    credit: CreditConfig = Field(default_factory=CreditConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    warm_start: WarmStartSection | None = None
    report: ReportSection | None = None
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
    if "logging" in raw:  # like every trainer group, it is a sub-table of [trainer]
        raise InvalidRequestError(
            f"{path}: write [logging] as [trainer.logging] (and [logging.wandb] as "
            "[trainer.logging.wandb]); see docs/logging.md"
        )
    base = path.resolve().parent
    try:  # flat settings first, so that a command-line override of their group patches them
        trainer = upgrade_flat_settings(raw.get("trainer", {}), stacklevel=2)
    except FlatSettingConflictError as exc:
        raise FlatSettingConflictError(f"{path}: {exc}") from exc
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


def load_model(config: RunConfig) -> tuple[PreTrainedModel | Path | str, PreTrainedTokenizerBase | None]:
    """`[model] path`: a `save_pretrained` folder (its tokenizer loads with it), a packaged model's
    name or a `.gguf` file, a `module:function` (or a `BUILTIN_MODELS` name) whose function returns
    `(model, tokenizer)`, or a hub id."""
    warm = config.warm_start
    if warm is not None:
        out = warm.out_dir(config.base_dir)
        named = Path(config.model.path).expanduser()
        named = named if named.is_absolute() else config.base_dir / named
        if named.resolve() == out.resolve() and not out.exists():
            raise InvalidRequestError(
                f"model {config.model.path!r} is this config's warm start, which is not built yet: "
                "run `reinforge sft` on this config first"
            )
    return load_model_spec(config.model.path, config.base_dir)


def load_model_spec(
    name: str, base_dir: Path
) -> tuple[PreTrainedModel | Path | str, PreTrainedTokenizerBase | None]:
    """A model named as `[model] path` names one, relative paths starting at `base_dir`: an existing
    folder (a Path), a `.gguf` file or a packaged model's name (its converted folder in the models
    cache, a Path), a `module:function` loader's `(model, tokenizer)`, or else an `org/name` hub id,
    returned unchanged for `from_pretrained` to resolve (a str)."""
    spec = BUILTIN_MODELS.get(name, name)
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else base_dir / spec
    if path.is_file() and path.suffix == ".gguf":
        return Path(resolve_model(path)), None
    if path.exists():
        return path, None
    if spec in PACKAGED_MODELS:
        return Path(resolve_model(spec)), None
    if not _LOADER.fullmatch(spec):
        if _HUB_ID.fullmatch(spec):
            return spec, None
        raise InvalidRequestError(
            f"model {name!r}: there is no folder {path}, and it is neither 'module:function', a packaged "
            f"model ({', '.join(PACKAGED_MODELS)}) nor a model hub id 'org/name'"
        )
    loader = load_callable(spec, base_dir, what="model")
    loaded = loader()
    if not (isinstance(loaded, tuple) and len(loaded) == 2):
        raise InvalidRequestError(f"model loader {spec!r} must return (model, tokenizer)")
    model, tokenizer = loaded
    return model, tokenizer


def load_callable(spec: str, base_dir: Path, *, what: str) -> Any:
    """The object a `module:attribute` names (`base_dir` importable), or a clear error."""
    if not _LOADER.fullmatch(spec):
        raise InvalidRequestError(f"{what} {spec!r}: use 'module:function'")
    _importable(base_dir)
    module_name, _, attr = spec.partition(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise InvalidRequestError(f"cannot load {what} {spec!r}: {exc}") from exc


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
        if ":" not in spec:
            raise InvalidRequestError(f"dataset {spec!r}: use 'module:function' or a .jsonl/.json file")
        obj = load_callable(spec, base_dir, what="dataset")
        items = obj() if callable(obj) else obj
    if not isinstance(items, list) or not all(isinstance(t, dict) for t in items):
        raise InvalidRequestError(f"dataset {spec!r} must be a list of JSON objects (dicts)")
    return items


def _importable(folder: Path) -> None:
    if str(folder) not in sys.path:
        sys.path.insert(0, str(folder))
