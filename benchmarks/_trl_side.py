"""The TRL side of benchmarks/trainer_bench.py: GRPO with TRL's GRPOTrainer, run in TRL's own venv.

Run by trainer_bench.py as `.bench/trl-venv/bin/python benchmarks/_trl_side.py CONFIG.json OUT.json`;
it imports nothing from reinforge (that venv has TRL, not reinforge). The config names the saved model
folder (the same weights reinforge trains), the prompts already rendered with the model's chat
template, and the shared hyper-parameters. It trains for a wall-clock budget, saves the final model
for the common evaluation, and writes per-step times and rewards.

Fairness settings, each chosen to match reinforge's trainer:
- float32, no gradient checkpointing (TRL's defaults are bf16 and checkpointing on);
- one optimiser step per generation batch of `prompts_per_step x group_size` completions, one
  forward/backward over the whole batch (reinforge fits a step's batch in one micro-batch);
- AdamW with a constant learning rate, grad-norm clip 1.0, no KL term (beta 0), clip epsilon 0.2,
  `loss_type="dapo"` (token-mean, reinforge's default aggregation), one iteration per batch;
- completions stop at the tokenizer's EOS, which is also where reinforge's engine stops;
- TRL decodes completions with `skip_special_tokens=True` before the reward function; the reward
  here decodes `completion_ids` itself with special tokens kept, so nothing is lost either way.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path
from typing import Any

import torch

_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def first_tool_expression(text: str) -> str | None:
    """The `expression` argument of the first `<tool_call>` in `text`, or None when there is none."""
    match = _TOOL_CALL.search(text)
    if match is None:
        return None
    try:
        call = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or call.get("name") != "calculator":
        return None
    arguments = call.get("arguments")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if not isinstance(arguments, dict) or not isinstance(arguments.get("expression"), str):
        return None
    return str(arguments["expression"]).replace(" ", "")


def main(config_path: str, out_path: str) -> None:
    config: dict[str, Any] = json.loads(Path(config_path).read_text(encoding="utf-8"))
    torch.set_num_threads(int(config.get("threads", 1)))
    started = time.monotonic()

    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    tokenizer = AutoTokenizer.from_pretrained(config["model_dir"])
    tokenizer.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(config["model_dir"], dtype=torch.float32)
    # Stop where reinforge's engine backend stops a chat completion: EOS and the turn markers.
    # GRPOTrainer takes every eos id of the model's generation config as a stop.
    model.generation_config.eos_token_id = list(config["stop_token_ids"])

    def reward_first_call(completion_ids: list[list[int]], expected: list[str], **_: Any) -> list[float]:
        """1.0 when the first tool call computes the right sub-expression first."""
        texts = tokenizer.batch_decode(completion_ids, skip_special_tokens=False)
        return [1.0 if first_tool_expression(t) == e else 0.0 for t, e in zip(texts, expected, strict=True)]

    rows = config["prompts"]
    dataset = Dataset.from_list([{"prompt": r["prompt"], "expected": r["expected"]} for r in rows])
    batch = int(config["prompts_per_step"]) * int(config["group_size"])
    args = GRPOConfig(
        output_dir=str(Path(config["work_dir"]) / "trl-out"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=int(config["group_size"]),
        max_completion_length=int(config["max_tokens"]),
        temperature=float(config["temperature"]),
        learning_rate=float(config["learning_rate"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        optim="adamw_torch",
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        num_iterations=1,
        scale_rewards="group",
        max_steps=int(config["max_steps"]),
        gradient_checkpointing=False,
        bf16=False,
        fp16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=int(config["seed"]),
        dataloader_num_workers=0,
        disable_tqdm=True,
        log_completions=False,
    )
    step_ends: list[float] = []
    step_cpu: list[float] = []  # this process's CPU seconds (every thread) at each step's end
    rewards: list[float] = []
    budget = float(config["seconds"])

    class Clock(TrainerCallback):
        """Timestamps each optimiser step and stops training once the wall budget is spent."""

        t0 = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.t0 = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            step_ends.append(time.monotonic() - self.t0)
            step_cpu.append(time.process_time())
            if step_ends[-1] >= budget:
                control.should_training_stop = True

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_first_call,
        args=args,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[Clock()],
    )
    # Time generation (HF generate inside GRPOTrainer) to show where a step's time goes.
    generate_s = [0.0]
    generate = trainer._generate_single_turn

    def timed_generate(*a: Any, **k: Any) -> Any:
        t0 = time.monotonic()
        try:
            return generate(*a, **k)
        finally:
            generate_s[0] += time.monotonic() - t0

    trainer._generate_single_turn = timed_generate
    setup_s = time.monotonic() - started
    trainer.train()
    final_dir = Path(config["work_dir"]) / "trl-final"
    trainer.model.save_pretrained(final_dir, safe_serialization=True)
    tokenizer.save_pretrained(final_dir)
    result = {
        "trl_version": trl.__version__,
        "torch_version": torch.__version__,
        "setup_s": setup_s,
        "steps": len(step_ends),
        "step_ends_s": step_ends,
        "step_cpu_s": step_cpu,
        "rewards": rewards,
        "final_model_dir": str(final_dir),
        "generate_s": generate_s[0],
    }
    Path(out_path).write_text(json.dumps(result) + "\n", encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit("usage: _trl_side.py CONFIG.json OUT.json")
    main(sys.argv[1], sys.argv[2])
