"""Do reinforge's GRPO advantages and losses equal TRL's, computed by TRL's own code?

The fixed tensors of tests/algorithms/test_reference_parity.py (three reward groups of five; three
sequences with fixed log-probabilities, old and behaviour log-probabilities, advantages and a mask
with a masked context token) go through reinforge's `compute_advantages` and `policy_loss` here, and
through a real `trl.GRPOTrainer` (and `RLOOTrainer`) in the TRL baseline's venv (`.bench/trl-venv`,
installed on first use by `_trl_venv.py`, as for trainer_bench). TRL keeps this maths inline in its
trainers' methods, so the TRL side builds each trainer for real (the demo's warm-start model, a
one-row dataset, the config under test) and drives its methods with only the model and the sampler
replaced:

- advantages: `_generate_and_score_completions` with `_generate` returning fixed token ids, and a
  reward function that returns the fixture's rewards; TRL's grouping, mean, std (+1e-4) and RLOO's
  leave-one-out baseline produce the advantages.
- losses: the same method with `_generate` also returning the behaviour log-probabilities and a
  tool mask (TRL's multi-turn mask, which puts the masked context token inside the completion), and
  the trainer's per-token log-probability forward returning the fixture's old log-probabilities:
  TRL computes its truncated importance weights (vLLM correction, "token_truncate", cap C). Then
  `_compute_loss` with the forward returning the fixture's current log-probabilities (a leaf
  tensor), for loss_type "grpo", "bnpo", "dr_grpo" and "dapo"; the loss and its gradient are compared.

TRL's `vllm_importance_sampling_correction` runs only with `use_vllm`, which TRL refuses to construct
without vLLM installed, so it is switched on after construction (nothing else of vLLM is used).
TRL's "dr_grpo" divides the summed token losses by rows x `max_completion_length`; reinforge's
closest aggregation is "seq-mean-token-sum" (divided by rows), so that one is compared divided by
`max_completion_length`. Everything runs in float64.

    .venv/bin/python benchmarks/trl_parity.py

prints each case's largest absolute difference and `RESULT trl_parity_max_abs_diff=<x>` (bar 1e-6);
if TRL cannot be installed it says why and prints no RESULT.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the TRL side runs in a venv without reinforge
    from reinforge.algorithms.config import LossAggregation

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "algorithms" / "test_reference_parity.py"
TRL_STD_EPS = 1e-4
"""TRL adds 1e-4 to the group std (reinforge's `GRPO.std_eps` defaults to 1e-6; set to TRL's here)."""
TIS_CAP = 2.0
"""The truncated importance sampling cap: reinforge's default `tis_cap`, TRL's
`vllm_importance_sampling_clip_max`."""
CLIP_EPS = 0.2
DAPO_CLIP_HIGH = 0.28

# loss_type in TRL -> (reinforge's aggregation, clip_eps_high), and the divisor applied to reinforge's loss.
LOSS_CASES: dict[str, tuple[LossAggregation, float | None]] = {
    "grpo": ("seq-mean-token-mean", None),
    "bnpo": ("token-mean", None),
    "dr_grpo": ("seq-mean-token-sum", None),
    "dapo": ("token-mean", DAPO_CLIP_HIGH),
}


def load_fixtures() -> dict[str, Any]:
    """The reference-parity test's fixed numbers, as plain lists (they travel to the TRL venv as JSON)."""
    spec = importlib.util.spec_from_file_location("reference_parity_fixtures", FIXTURES)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {
        "rewards": [list(map(float, group)) for group in module.REWARDS],
        "mask": module.MASK.tolist(),
        "logprobs": module.LOGPROBS.tolist(),
        "old": module.OLD.tolist(),
        "behaviour": module.BEHAVIOUR.tolist(),
        "advantages": module.ADVANTAGES.tolist(),
    }


def reinforge_side(fixtures: dict[str, Any]) -> dict[str, Any]:
    """reinforge's advantages for each reward group and its loss and d loss / d logprobs per loss_type."""
    import torch

    from reinforge.algorithms import GRPO, RLOO, compute_advantages, policy_loss
    from reinforge.types import Transition

    rewards: list[list[float]] = fixtures["rewards"]
    group_size = len(rewards[0])

    def advantages(algorithm: GRPO | RLOO) -> list[float]:
        batch = [
            Transition(
                rollout_id=f"g{g}-{i}",
                attempt_id=f"a{g}-{i}",
                group_id=f"g{g}",
                prompt_ids=[1],
                response_ids=[2],
                response_mask=[1],
                behaviour_logprobs=[0.0],
                reward=r,
                final_reward=r,
            )
            for g, group in enumerate(rewards)
            for i, r in enumerate(group)
        ]
        compute_advantages(batch, algorithm)
        return [float(t.advantage or 0.0) for t in batch]

    out: dict[str, Any] = {
        "advantages": {
            "grpo": advantages(GRPO(group_size=group_size, std_eps=TRL_STD_EPS)),
            "dr_grpo": advantages(GRPO(group_size=group_size, scale_by_std=False)),
            "rloo": advantages(RLOO(group_size=group_size)),
        },
        "losses": {},
    }
    mask = torch.tensor(fixtures["mask"], dtype=torch.float64)
    width = mask.shape[1]
    for loss_type, (loss_agg, clip_high) in LOSS_CASES.items():
        config = GRPO(
            group_size=2,
            loss_agg=loss_agg,
            seq_unit="transition",
            clip_eps_low=CLIP_EPS,
            clip_eps_high=clip_high,
            tis_cap=TIS_CAP,
        )
        logprobs = torch.tensor(fixtures["logprobs"], dtype=torch.float64, requires_grad=True)
        loss, _ = policy_loss(
            logprobs,
            torch.tensor(fixtures["behaviour"], dtype=torch.float64),
            torch.tensor(fixtures["advantages"], dtype=torch.float64),
            mask,
            config,
            old_logprobs=torch.tensor(fixtures["old"], dtype=torch.float64),
        )
        if loss_type == "dr_grpo":
            loss = loss / width  # TRL: / (rows x max_completion_length); reinforge: / rows
        loss.backward()
        assert logprobs.grad is not None
        out["losses"][loss_type] = {"loss": float(loss.detach()), "grad": logprobs.grad.tolist()}
    return out


def max_abs_diffs(ours: dict[str, Any], theirs: dict[str, Any]) -> dict[str, float]:
    """The largest |ours - theirs| per case ("advantages/grpo", "loss/dapo", "grad/dapo", ...)."""

    def flat(value: Any) -> list[float]:
        if isinstance(value, list):
            return [x for item in value for x in flat(item)]
        return [float(value)]

    diffs: dict[str, float] = {}
    for name, values in ours["advantages"].items():
        a, b = flat(values), flat(theirs["advantages"][name])
        if len(a) != len(b):
            raise ValueError(f"advantages/{name}: {len(a)} values against {len(b)}")
        diffs[f"advantages/{name}"] = max(abs(x - y) for x, y in zip(a, b, strict=True))
    for name, values in ours["losses"].items():
        for key in ("loss", "grad"):
            a, b = flat(values[key]), flat(theirs["losses"][name][key])
            if len(a) != len(b):
                raise ValueError(f"{key}/{name}: {len(a)} values against {len(b)}")
            diffs[f"{key}/{name}"] = max(abs(x - y) for x, y in zip(a, b, strict=True))
    return diffs


# ---------------------------------------------------------------- the TRL side (runs in .bench/trl-venv)


def trl_side(config: dict[str, Any]) -> dict[str, Any]:
    """TRL's advantages, losses and gradients on the fixtures, by its trainers' own methods."""
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

    torch.set_num_threads(1)
    fixtures = config["fixtures"]
    tokenizer = AutoTokenizer.from_pretrained(config["model_dir"])
    dataset = Dataset.from_list([{"prompt": "1+1", "reward": 0.0}])

    def reward_column(completions: list[Any], reward: list[float], **_: Any) -> list[float]:
        """The fixture's reward of each row, passed through the dataset's `reward` column."""
        return [float(r) for r in reward]

    def build(trainer_class: Any, config_class: Any, work: str, rows: int, group: int, **options: Any) -> Any:
        model = AutoModelForCausalLM.from_pretrained(config["model_dir"], dtype=torch.float64)
        args = config_class(
            output_dir=work,
            per_device_train_batch_size=rows,
            gradient_accumulation_steps=1,
            num_generations=group,
            beta=0.0,
            use_cpu=True,
            bf16=False,
            fp16=False,
            report_to="none",
            save_strategy="no",
            disable_tqdm=True,
            log_completions=False,
            **options,
        )
        trainer = trainer_class(
            model=model,
            reward_funcs=reward_column,
            args=args,
            train_dataset=dataset,
            processing_class=tokenizer,
        )
        trainer.model.train()
        return trainer

    def rows_of(rewards: list[float]) -> list[dict[str, Any]]:
        return [{"prompt": "1+1", "reward": r} for r in rewards]

    out: dict[str, Any] = {"trl_version": trl.__version__, "advantages": {}, "losses": {}}
    flat_rewards = [r for group in fixtures["rewards"] for r in group]
    group_size = len(fixtures["rewards"][0])
    n = len(flat_rewards)
    with tempfile.TemporaryDirectory() as work:
        # Advantages: GRPO with the group std ("group") and without it (Dr. GRPO, "none"), then RLOO.
        for name, scale in (("grpo", "group"), ("dr_grpo", "none")):
            trainer = build(
                GRPOTrainer, GRPOConfig, work, n, group_size, scale_rewards=scale, max_completion_length=4
            )
            trainer._generate = lambda prompts: (
                [[1]] * len(prompts),
                [[2, 3]] * len(prompts),
                None,
                ["x"] * len(prompts),
                None,
                {},
                None,
                [None] * len(prompts),
            )
            output = trainer._generate_and_score_completions(rows_of(flat_rewards))
            out["advantages"][name] = output["advantages"].tolist()
        trainer = build(
            RLOOTrainer, RLOOConfig, work, n, group_size, normalize_advantages=False, max_completion_length=4
        )
        trainer._generate = lambda prompts: (
            [[1]] * len(prompts),
            [[2, 3]] * len(prompts),
            ["x"] * len(prompts),
        )
        output = trainer._generate_and_score_completions(rows_of(flat_rewards))
        out["advantages"]["rloo"] = output["advantages"].tolist()

        # Losses: the mask's leading zeros inside a completion are TRL's tool mask (multi-turn).
        mask = torch.tensor(fixtures["mask"], dtype=torch.float64)
        rows, width = mask.shape
        lengths = [int(row.nonzero().max()) + 1 for row in mask]
        completions = [list(range(10, 10 + k)) for k in lengths]
        tool_masks = [[int(x) for x in mask[i, :k]] for i, k in enumerate(lengths)]
        behaviour = [fixtures["behaviour"][i][:k] for i, k in enumerate(lengths)]
        for loss_type, clip_high in (
            ("grpo", None),
            ("bnpo", None),
            ("dr_grpo", None),
            ("dapo", DAPO_CLIP_HIGH),
        ):
            trainer = build(
                GRPOTrainer,
                GRPOConfig,
                work,
                rows,
                rows,
                loss_type=loss_type,
                epsilon=CLIP_EPS,
                epsilon_high=clip_high,
                max_completion_length=width,
                vllm_importance_sampling_mode="token_truncate",
                vllm_importance_sampling_clip_max=TIS_CAP,
            )
            # TRL constructs use_vllm only with vLLM installed; its correction needs nothing of vLLM.
            trainer.use_vllm = True
            trainer.vllm_importance_sampling_correction = True
            forward = {"logps": torch.tensor(fixtures["old"], dtype=torch.float64)}

            def per_token_logps(*_: Any, _forward: dict[str, torch.Tensor] = forward, **__: Any) -> Any:
                logps = _forward["logps"]
                return logps, torch.zeros_like(logps.detach()), None

            trainer._get_per_token_logps_and_entropies = per_token_logps
            trainer._generate = lambda prompts: (
                [[1]] * len(prompts),
                completions,
                tool_masks,
                ["x"] * len(prompts),
                behaviour,
                {},
                None,
                [None] * len(prompts),
            )
            inputs = trainer._generate_and_score_completions(rows_of([0.0, 1.0, 0.5]))
            if not torch.equal(inputs["completion_mask"] * inputs["tool_mask"], mask.to(torch.long)):
                raise RuntimeError("TRL's mask is not the fixture's mask")
            inputs["advantages"] = torch.tensor(fixtures["advantages"], dtype=torch.float64)
            logprobs = torch.tensor(fixtures["logprobs"], dtype=torch.float64, requires_grad=True)
            forward["logps"] = logprobs
            trainer.current_gradient_accumulation_steps = 1
            loss = trainer._compute_loss(trainer.model, inputs)
            loss.backward()
            assert logprobs.grad is not None
            out["losses"][loss_type] = {"loss": float(loss.detach()), "grad": logprobs.grad.tolist()}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--trl-side", nargs=2, metavar=("CONFIG", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--bar", type=float, default=1e-6)
    args = parser.parse_args()
    if args.trl_side:
        config = json.loads(Path(args.trl_side[0]).read_text(encoding="utf-8"))
        Path(args.trl_side[1]).write_text(json.dumps(trl_side(config)), encoding="utf-8")
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import _trl_venv

    from reinforge.demo.warm_start import SHIPPED_WARM_START

    fixtures = load_fixtures()
    ours = reinforge_side(fixtures)
    python = _trl_venv.trl_python()
    if isinstance(python, str):
        print(f"TRL could not be installed, so there is nothing to compare with: {python}")
        return
    with tempfile.TemporaryDirectory() as work:
        config_path, out_path = Path(work) / "config.json", Path(work) / "trl.json"
        config_path.write_text(
            json.dumps({"fixtures": fixtures, "model_dir": str(SHIPPED_WARM_START)}), encoding="utf-8"
        )
        done = subprocess.run(
            [str(python), str(Path(__file__).resolve()), "--trl-side", str(config_path), str(out_path)],
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            print(done.stdout + done.stderr)
            raise SystemExit(f"the TRL side failed (exit {done.returncode})")
        theirs = json.loads(out_path.read_text(encoding="utf-8"))
    diffs = max_abs_diffs(ours, theirs)
    print(f"TRL {theirs['trl_version']} against reinforge, largest |difference| per case:")
    for name, diff in diffs.items():
        print(f"    {name:<22} {diff:.2e}")
    worst = max(diffs.values())
    print(f"bar {args.bar:g}: {'met' if worst <= args.bar else 'NOT met'}")
    print(f"RESULT trl_parity_max_abs_diff={worst:.2e}")


if __name__ == "__main__":
    main()
