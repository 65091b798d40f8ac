"""`reinforge train config.toml`: a whole run from a TOML file, and clear errors for bad files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from reinforge.cli import app
from reinforge.errors import InvalidRequestError
from reinforge.training.run_config import (
    BUILTIN_CALC,
    BUILTIN_MODELS,
    load_dataset,
    load_model,
    load_run_config,
)

from .conftest import small_model

AGENT = """
from openai import AsyncOpenAI
import reinforge.runner


@reinforge.runner.agent(name="toy")
async def solve(task, llm):
    client = AsyncOpenAI(base_url=llm.base_url, api_key=llm.api_key, max_retries=0)
    try:
        r = await client.chat.completions.create(
            model=llm.model, messages=[{"role": "user", "content": task["question"]}], max_tokens=4
        )
        return float(len(r.choices[0].message.content or "") % 2)
    finally:
        await client.close()
"""


def write_run(folder: Path, tokenizer: Any, extra: str = "") -> Path:
    model = small_model(tokenizer)
    model.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    (folder / "toy_agent.py").write_text(AGENT)
    (folder / "train.jsonl").write_text("".join(json.dumps({"question": f"{i}+1"}) + "\n" for i in range(6)))
    config = folder / "run.toml"
    config.write_text(
        f"""
[model]
path = "model"
[agent]
entry = "toy_agent:solve"
[data]
train = "train.jsonl"
[algorithm]
name = "grpo"
group_size = 2
[credit]
mode = "per_call"
[trainer]
run_dir = "out"
progress = false
[trainer.schedule]
max_steps = 1
[trainer.rollouts]
tasks_per_step = 2
max_tokens = 4
[trainer.engine]
max_batch_size = 8
max_seq_len = 128
{extra}
"""
    )
    return config


def test_train_command_runs_a_config_file(tokenizer: Any, tmp_path: Path) -> None:
    config = write_run(tmp_path, tokenizer)
    out = CliRunner().invoke(app, ["train", str(config), "--max-steps", "2"])
    assert out.exit_code == 0, out.output
    assert "trained 2 steps (policy v2)" in out.output
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/reward" in r] == [1, 2]


def test_bad_config_files_are_clear_errors(tokenizer: Any, tmp_path: Path) -> None:
    config = write_run(tmp_path, tokenizer, extra="learning_rat = 0.1")
    out = CliRunner().invoke(app, ["train", str(config)])
    assert out.exit_code == 2 and "learning_rat" in out.output
    missing = CliRunner().invoke(app, ["train", str(tmp_path / "nope.toml")])
    assert missing.exit_code == 2 and "does not exist" in missing.output
    (tmp_path / "bad.toml").write_text("[agent\n")
    assert "not valid TOML" in CliRunner().invoke(app, ["train", str(tmp_path / "bad.toml")]).output
    (tmp_path / "algo.toml").write_text(
        '[agent]\nentry="a:b"\n[data]\ntrain="t.jsonl"\n[algorithm]\nname="grpo"\nlam=0.9\n'
    )
    with pytest.raises(InvalidRequestError, match="lam"):
        load_run_config(tmp_path / "algo.toml")
    (tmp_path / "two.toml").write_text(
        '[agent]\nentry="a:b"\ncommand="python x.py"\n[data]\ntrain="t.jsonl"\n'
    )
    with pytest.raises(InvalidRequestError, match="exactly one"):
        load_run_config(tmp_path / "two.toml")


def test_a_flat_setting_beside_its_table_field_is_refused(tokenizer: Any, tmp_path: Path) -> None:
    """The deprecated flat name beside its sub-table's field: which one was meant is unknown."""
    config = write_run(tmp_path, tokenizer)
    text = config.read_text().replace("[trainer]\n", "[trainer]\nmax_steps = 2\n")
    config.write_text(text)
    out = CliRunner().invoke(app, ["train", str(config)])
    assert out.exit_code == 2
    assert "`max_steps` and `schedule.max_steps` are both given" in out.output


def test_command_line_overrides_keep_the_other_settings_of_their_group(
    tokenizer: Any, tmp_path: Path
) -> None:
    config = write_run(tmp_path, tokenizer, extra="[trainer.checkpoints]\nkeep = 3")
    loaded = load_run_config(config, {"schedule": {"max_minutes": 2.0}, "checkpoints": {"resume": False}})
    assert loaded.trainer.schedule.max_minutes == 2.0 and loaded.trainer.schedule.max_steps == 1
    assert loaded.trainer.checkpoints.keep == 3 and loaded.trainer.checkpoints.resume is False


def test_the_model_can_come_from_a_loader_function(tokenizer: Any, tmp_path: Path) -> None:
    config = write_run(tmp_path, tokenizer)
    (tmp_path / "my_model.py").write_text(
        "from transformers import AutoModelForCausalLM, AutoTokenizer\n"
        "def load():\n"
        f"    return AutoModelForCausalLM.from_pretrained({str(tmp_path / 'model')!r}), "
        f"AutoTokenizer.from_pretrained({str(tmp_path / 'model')!r})\n"
    )
    config.write_text(config.read_text().replace('path = "model"', 'path = "my_model:load"'))
    model, loaded_tokenizer = load_model(load_run_config(config))
    assert not isinstance(model, Path) and loaded_tokenizer is not None
    (tmp_path / "f").mkdir()
    folder, none = load_model(load_run_config(write_run(tmp_path / "f", tokenizer)))
    assert folder == tmp_path / "f" / "model" and none is None
    assert BUILTIN_MODELS[BUILTIN_CALC] == "reinforge.demo.warm_start:load_warm_start"


def test_a_warm_start_not_built_yet_says_to_run_sft(tokenizer: Any, tmp_path: Path) -> None:
    config = write_run(tmp_path, tokenizer)
    text = config.read_text().replace('path = "model"', 'path = "ws"')
    config.write_text(text + '\n[warm_start]\nbase = "model"\npolicy = "m:reply"\nout = "ws"\n')
    with pytest.raises(InvalidRequestError, match="run `reinforge sft` on this config first"):
        load_model(load_run_config(config))
    (tmp_path / "ws").symlink_to(tmp_path / "model")  # once built, it loads as any folder
    assert load_model(load_run_config(config)) == (tmp_path / "ws", None)


def test_datasets_load_from_files_and_functions(tmp_path: Path) -> None:
    (tmp_path / "d.json").write_text(json.dumps([{"q": 1}, {"q": 2}]))
    assert load_dataset("d.json", tmp_path) == [{"q": 1}, {"q": 2}]
    assert len(load_dataset("reinforge.demo.tasks:val_tasks", tmp_path)) == 200
    (tmp_path / "bad.json").write_text(json.dumps({"q": 1}))
    for spec in ("bad.json", "missing.jsonl", "no_colon", "reinforge.demo.tasks:nothing"):
        with pytest.raises(InvalidRequestError):
            load_dataset(spec, tmp_path)


def test_the_calc_example_config_is_valid() -> None:
    config = load_run_config(Path(__file__).parents[2] / "examples" / "calc" / "config.toml")
    assert config.algorithm_config().group_size == 8  # type: ignore[union-attr]
    assert config.credit.mode == "merged" and config.trainer.schedule.max_minutes == 5
    assert config.trainer.runners.processes == 2 and config.trainer.optim.learning_rate == 5e-4


def test_report_section_ends_the_run_with_a_result_line(tokenizer: Any, tmp_path: Path) -> None:
    config = write_run(tmp_path, tokenizer, extra='[report]\nname = "toy"\nmetric = "reward"')
    config.write_text(
        config.read_text().replace('train = "train.jsonl"', 'train = "train.jsonl"\nval = "train.jsonl"')
    )
    out = CliRunner().invoke(app, ["train", str(config), "--max-steps", "1"])
    assert out.exit_code == 0, out.output
    line = next(x for x in out.output.splitlines() if x.startswith("RESULT "))
    records = [json.loads(x) for x in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    before = next(r for r in records if r["step"] == 0 and "val/reward" in r)["val/reward"]
    after = [r for r in records if "val/reward" in r][-1]["val/reward"]
    assert line == f"RESULT toy_heldout before={before:.3f} after={after:.3f}"
    config.write_text(config.read_text().replace('metric = "reward"', 'metric = "f1"'))
    bad = CliRunner().invoke(app, ["train", str(config)])
    assert bad.exit_code == 2 and "metric" in bad.output
