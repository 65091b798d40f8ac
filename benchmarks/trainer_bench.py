"""Trainer throughput: reinforge's RL trainer vs TRL's GRPOTrainer on the same single-turn task.

The task is the calc demo's first decision: the prompt is the question (with the calculator tool in
the chat template), the completion should be the right first `<tool_call>` (the sub-expression that
respects operator precedence); reward 1 when it is, else 0. Both sides start from the same weights
(the demo's warm-started 1.1M-parameter Llama), with the same group size, prompts per step,
learning rate, temperature and completion budget, one optimiser step per batch, and the same wall
time. They run one after the other in this process's run (TRL in its own venv, `.bench/trl-venv`).

reinforge's side is the product path: `reinforge.training.Trainer.fit` with an agent that sends
its chat call over HTTP to the gateway (the OpenAI-compatible API, through reinforge's keep-alive
transport) → embedded engine, spans recorded in the store (SQLite), runners leasing from the
store, credit/ → GRPO advantages → `Policy.update` → weights published to the engine. The agents
run in `--runner-processes` (default 2) `reinforge runner` children
(`TrainerConfig.runners.processes`: the agents' own Python then runs beside the trainer's instead of
under its interpreter lock); `--runner-processes 0` runs them in the trainer's process. The engine
runs in its own process (`--engine-process on`, `TrainerConfig.engine.process`): with the agents in
runner processes, the trainer's process otherwise sits at one core under its interpreter lock. The
runners have room for two steps' rollouts, so that `Trainer.fit`'s default `prefetch_rollouts`
starts the next step's agents while this step generates (their calls wait at the gateway for the
new weights: still strictly on-policy).

Printed: steps/s and the training reward of each side, then both final models evaluated by the same
code on held-out questions (sampled at the training temperature, and greedy), and
`RESULT trainer_steps_per_s_ratio_vs_trl=<ours / trl>` for `Trainer.fit` with its defaults apart
from `runner_processes` and `engine_process`. Each side also prints its CPU per step (every
process it runs, over the steps its steps/s counts) and, for reinforge, the most steps/s that CPU
allows with every core busy: no scheduling beats that ceiling.

The agent is the thinnest one that goes through the whole spine, because TRL's side has no agent
at all (a reward function over token ids): what the bench compares is the trainers. A second
`Trainer.fit` side runs the same agent written with the OpenAI SDK (`chat.completions.create`, a
client per rollout) and prints `RESULT trainer_openai_agent_steps_per_s_ratio_vs_trl=<x>`: the
SDK's own Python (building and validating the request, parsing the reply) costs about as much CPU
per call as the gateway and the store together, and on two cores that CPU is what the step waits
for. A third side runs `Trainer.fit` with `overlap_rollouts=True` (the next step's rollouts
generated during this step's update, one policy version behind, TIS-corrected: not the default
because it is not strictly on-policy) and prints `RESULT trainer_overlap_steps_per_s_ratio_vs_trl=<x>`.
TRL gets two torch threads, both cores of the development machine, as reinforge's runner processes
and threads have: its update gains from the second thread (1.54 against 1.04 steps/s with one),
and a baseline is measured at its best. `--trl-threads 1` gives the one-thread figure this bench
printed until session 4.

    .venv/bin/python benchmarks/trainer_bench.py            # 120 s per side
    .venv/bin/python benchmarks/trainer_bench.py --quick    # 15 s per side, a smoke run

The TRL baseline installs itself on first use into `.bench/trl-venv` (`_trl_venv.py`: torch first, so
pip keeps the local CPU wheel, then the pinned TRL).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _trl_venv  # noqa: E402
from _step_cpu import MetricsCpuSampler, StepCpu, from_step_ends  # noqa: E402
from _trl_side import first_tool_expression  # noqa: E402
from openai import AsyncOpenAI  # noqa: E402
from openai._base_client import get_platform  # noqa: E402
from transformers import PreTrainedModel, PreTrainedTokenizerBase  # noqa: E402

from reinforge import semconv  # noqa: E402
from reinforge.algorithms import GRPO, compute_advantages  # noqa: E402
from reinforge.credit import CreditConfig  # noqa: E402
from reinforge.demo.calculator import CALCULATOR_TOOL  # noqa: E402
from reinforge.demo.run import DemoSettings  # noqa: E402
from reinforge.demo.tasks import generate_tasks  # noqa: E402
from reinforge.demo.warm_start import SHIPPED_WARM_START, WarmStartConfig, build_warm_start, load_warm_start  # noqa: E402
from reinforge.engine.engine import Engine  # noqa: E402
from reinforge.engine.engine_backend import TURN_MARKERS  # noqa: E402
from reinforge.inference.contract import SamplingParams  # noqa: E402
from reinforge.runner import LLM, agent, gateway_http_client  # noqa: E402
from reinforge.store.factory import open_store  # noqa: E402
from reinforge.training import (  # noqa: E402
    CheckpointSettings,
    EngineSettings,
    OptimSettings,
    Policy,
    RolloutSettings,
    RunnerSettings,
    ScheduleSettings,
    Trainer,
    TrainerConfig,
)
from reinforge.types import SpanQuery, Transition  # noqa: E402

BUILT_WARM_START = ROOT / ".bench" / "calc-warm-start"


def expression_of(arguments: str) -> str | None:
    """The `expression` of a tool call's JSON arguments, spaces removed (None when unreadable)."""
    try:
        parsed = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("expression"), str):
        return None
    return str(parsed["expression"]).replace(" ", "")


_PLATFORM = get_platform()


def rollout_client(llm: LLM) -> AsyncOpenAI:
    """One rollout's OpenAI client on `gateway_http_client()` (shared keep-alive connections through
    reinforge's transport: a new httpx client per rollout would build an SSL context each time, and
    the SDK's default transport costs several times more CPU per call), with the platform the SDK
    puts in its `X-Stainless-*` headers detected once here, not by each client.

    A new client detects it before its first request in a worker thread (`asyncify(get_platform)`):
    with a client per rollout that is a thread round trip per rollout, which held each step's first
    call to the engine back ~50 ms. Handing the value over (a private attribute of the SDK's client)
    leaves the requests and headers as they were.
    """
    client = AsyncOpenAI(
        base_url=llm.base_url, api_key=llm.api_key, max_retries=1, http_client=gateway_http_client()
    )
    client._platform = _PLATFORM
    return client


def first_call_request(task: dict[str, Any], llm: LLM) -> dict[str, Any]:
    """The chat call both agents make: the question, the calculator tool, the run's sampling."""
    sampling = llm.resources.get("sampling") or {}
    return {
        "model": llm.model,
        "messages": [{"role": "user", "content": str(task["question"])}],
        "tools": [CALCULATOR_TOOL],
        "temperature": float(sampling.get("temperature", 1.0)),
        "max_tokens": int(sampling.get("max_tokens", 48)),
    }


def first_call_reward(name: str | None, arguments: str | None, task: dict[str, Any]) -> float:
    """1.0 when the first tool call is the calculator on the right sub-expression."""
    if name != "calculator" or arguments is None:
        return 0.0
    return 1.0 if expression_of(arguments) == task["expected"] else 0.0


@agent(name="first-call")
async def first_call_agent(task: dict[str, Any], llm: LLM) -> float:
    """One `POST /chat/completions` with the calculator tool, as any HTTP client (or an agent in
    another language) sends it: the JSON body, the rollout's key, the reply's first tool call."""
    response = await gateway_http_client().post(
        f"{llm.base_url.rstrip('/')}/chat/completions",
        json=first_call_request(task, llm),
        headers={"Authorization": f"Bearer {llm.api_key}"},
    )
    response.raise_for_status()
    message = response.json()["choices"][0]["message"]
    calls = [c for c in message.get("tool_calls") or [] if c.get("type") == "function"]
    if not calls:
        return 0.0
    return first_call_reward(calls[0]["function"].get("name"), calls[0]["function"].get("arguments"), task)


@agent(name="first-call")
async def first_call_agent_openai(task: dict[str, Any], llm: LLM) -> float:
    """The same call through the OpenAI SDK (`chat.completions.create`), with a client per rollout."""
    response = await rollout_client(llm).chat.completions.create(**first_call_request(task, llm))
    calls = [c for c in response.choices[0].message.tool_calls or [] if c.type == "function"]
    if not calls:
        return 0.0
    return first_call_reward(calls[0].function.name, calls[0].function.arguments, task)


def first_step(task: Any) -> str:
    a, op, b = task.steps[0]
    return f"{a}{op}{b}"


def single_turn_tasks(split: str, n: int, seed: int) -> list[dict[str, Any]]:
    return [
        {"task_id": t.task_id, "question": t.question, "expected": first_step(t)}
        for t in generate_tasks(split, n, seed)  # type: ignore[arg-type]
    ]


def prompt_text(tokenizer: PreTrainedTokenizerBase, question: str) -> str:
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}],
        tools=[CALCULATOR_TOOL],
        add_generation_prompt=True,
        tokenize=False,
    )
    return str(text)


def stop_ids(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """EOS plus the turn markers: where the gateway's engine backend ends a chat completion."""
    vocab = tokenizer.get_vocab()
    return sorted({int(tokenizer.eos_token_id), *(vocab[m] for m in TURN_MARKERS if m in vocab)})


def resolve_warm_start(explicit: Path | None) -> Path:
    """The given folder, else the warm start reinforge ships, else one built (once) under .bench/."""
    for path in (explicit, SHIPPED_WARM_START, BUILT_WARM_START):
        if path is not None and (path / "config.json").is_file():
            return path
    print(f"no shipped warm start; building the demo's recipe into {BUILT_WARM_START} (minutes, once)")
    build_warm_start(BUILT_WARM_START, WarmStartConfig(seed=DemoSettings().seed))
    return BUILT_WARM_START


def run_reinforge(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    train: list[dict[str, Any]],
    args: Any,
    work: Path,
    *,
    overlap: bool = False,
    openai_agent: bool = False,
) -> dict[str, Any]:
    name = "reinforge-run" + ("-overlap" if overlap else "") + ("-openai" if openai_agent else "")
    run_dir = work / name
    shutil.rmtree(run_dir, ignore_errors=True)
    trainer = Trainer(
        model,
        tokenizer,
        algorithm=GRPO(group_size=args.group_size),
        credit=CreditConfig(),
        config=TrainerConfig(
            run_dir=run_dir,
            seed=args.seed,
            progress=False,
            optim=OptimSettings(learning_rate=args.learning_rate),
            rollouts=RolloutSettings(
                tasks_per_step=args.prompts_per_step, temperature=1.0, max_tokens=args.max_tokens
            ),
            runners=RunnerSettings(
                concurrency=-(-2 * args.prompts_per_step * args.group_size // max(args.runner_processes, 1)),
                processes=args.runner_processes,
                **({} if args.runner_nice is None else {"processes_nice": args.runner_nice}),
            ),
            engine=EngineSettings(
                max_batch_size=args.prompts_per_step * args.group_size, process=args.engine_process == "on"
            ),
            schedule=ScheduleSettings(
                max_steps=100_000, max_minutes=args.seconds / 60, val_every=0, overlap_rollouts=overlap
            ),
            checkpoints=CheckpointSettings(every=0, resume=False),
        ),
    )
    with MetricsCpuSampler(run_dir / "metrics.jsonl") as cpu:
        fit = trainer.fit(first_call_agent_openai if openai_agent else first_call_agent, train)
    steps = [r for r in fit.history if "train/reward" in r]
    recorded_prompt = asyncio.run(_one_recorded_prompt(run_dir))
    return {
        "step_ends": [float(r["time/rl_s"]) for r in steps],
        "rewards": [float(r["train/reward"]) for r in steps],
        "rollout_s": sum(float(r["time/enqueue_s"]) + float(r["time/collect_s"]) for r in steps),
        "update_s": sum(float(r["time/update_s"]) for r in steps),
        "recorded_prompt": recorded_prompt,
        "model": trainer.model,
        "cpu": cpu.result(),
    }


async def _one_recorded_prompt(run_dir: Path) -> tuple[str, list[int]]:
    """One question and the prompt ids the gateway recorded for it (to check that TRL gets the same)."""
    store = await open_store(f"sqlite:///{(run_dir / 'store.db').resolve()}")
    try:
        page = await store.query_spans(SpanQuery(name=semconv.SPAN_LLM_CALL, limit=1))
        if not page.items or page.items[0].rollout_id is None:
            return "", []
        rollout = await store.get_rollout(page.items[0].rollout_id)
        ids = page.items[0].attributes.get(semconv.ATTR_PROMPT_TOKEN_IDS) or []
        return str(rollout.task["question"]), [int(i) for i in ids]
    finally:
        await store.close()


def run_trl(
    model_dir: Path, tokenizer: PreTrainedTokenizerBase, train: list[dict[str, Any]], args: Any, work: Path
) -> dict[str, Any] | str:
    """TRL's GRPOTrainer in its own venv; the reason as a string when it can't run."""
    trl_python = _trl_venv.trl_python()
    if isinstance(trl_python, str):
        return f"the TRL baseline could not be installed: {trl_python}"
    config = {
        "model_dir": str(model_dir),
        "work_dir": str(work),
        "prompts": [
            {"prompt": prompt_text(tokenizer, t["question"]), "expected": t["expected"]} for t in train
        ],
        "stop_token_ids": stop_ids(tokenizer),
        "group_size": args.group_size,
        "prompts_per_step": args.prompts_per_step,
        "learning_rate": args.learning_rate,
        "temperature": 1.0,
        "max_tokens": args.max_tokens,
        "seconds": args.seconds,
        "max_steps": 100_000,
        "seed": args.seed,
        "threads": args.trl_threads,
    }
    config_path, out_path = work / "trl-config.json", work / "trl-result.json"
    config_path.write_text(json.dumps(config), encoding="utf-8")
    out_path.unlink(missing_ok=True)
    threads = str(args.trl_threads)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "TOKENIZERS_PARALLELISM": "false",
    }
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(
        [str(trl_python), str(Path(__file__).with_name("_trl_side.py")), str(config_path), str(out_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=args.seconds * 4 + 600,
    )
    if proc.returncode != 0 or not out_path.is_file():
        return f"TRL run failed (exit {proc.returncode}): {proc.stderr.strip()[-1500:]}"
    result: dict[str, Any] = json.loads(out_path.read_text(encoding="utf-8"))
    return result


def run_core(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, train: list[dict[str, Any]], args: Any
) -> dict[str, Any]:
    """reinforge's training core without the spine: engine generation → GRPO → `Policy.update` →
    weights published to the engine. Same pieces the Trainer uses; no store, gateway, runner or HTTP."""
    return asyncio.run(_core(copy.deepcopy(model), tokenizer, train, args))


async def _core(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, train: list[dict[str, Any]], args: Any
) -> dict[str, Any]:
    algorithm = GRPO(group_size=args.group_size)
    policy = Policy(
        model,
        algorithm,
        OptimSettings(learning_rate=args.learning_rate),
        pad_token_id=int(tokenizer.pad_token_id),
    )
    batch = args.prompts_per_step * args.group_size
    engine = Engine(
        copy.deepcopy(model).eval(), tokenizer, max_batch_size=batch, max_seq_len=512, seed=args.seed
    )
    engine.start()
    sampling = SamplingParams(temperature=1.0, max_tokens=args.max_tokens, stop_token_ids=stop_ids(tokenizer))
    order = random.Random(args.seed).sample(range(len(train)), len(train))
    prompts = {}
    rewards: list[float] = []
    version, started = 0, time.monotonic()
    gen_s = update_s = 0.0
    step_ends: list[float] = []
    step_cpu: list[float] = []
    try:
        while time.monotonic() - started < args.seconds:
            picked = [
                train[order[(version * args.prompts_per_step + i) % len(order)]]
                for i in range(args.prompts_per_step)
            ]
            for task in picked:
                if task["task_id"] not in prompts:
                    text = prompt_text(tokenizer, task["question"])
                    prompts[task["task_id"]] = list(tokenizer(text, add_special_tokens=False)["input_ids"])
            jobs = [(n, g, task) for n, task in enumerate(picked) for g in range(args.group_size)]
            t0 = time.monotonic()
            outs = await asyncio.gather(
                *(engine.generate(prompts[t["task_id"]], sampling) for _, _, t in jobs)
            )
            gen_s += time.monotonic() - t0
            transitions = []
            for (n, g, task), out in zip(jobs, outs, strict=True):
                text = str(tokenizer.decode(out.token_ids, skip_special_tokens=False))
                reward = 1.0 if first_tool_expression(text) == task["expected"] else 0.0
                transitions.append(
                    Transition(
                        rollout_id=f"{version}-{n}-{g}",
                        attempt_id=f"{version}-{n}-{g}",
                        group_id=f"{version}-{n}",
                        prompt_ids=prompts[task["task_id"]],
                        response_ids=out.token_ids,
                        response_mask=[1] * len(out.token_ids),
                        behaviour_logprobs=out.logprobs,
                        policy_version=out.policy_version,
                        reward=reward,
                        final_reward=reward,
                    )
                )
            rewards.append(sum(t.reward for t in transitions) / len(transitions))
            compute_advantages(transitions, algorithm)
            t0 = time.monotonic()
            await asyncio.to_thread(policy.update, transitions)
            update_s += time.monotonic() - t0
            version += 1
            await engine.load_weights(policy.engine_state(), version)
            step_ends.append(time.monotonic() - started)
            step_cpu.append(time.process_time())
        return {
            "step_ends": step_ends,
            "cpu": from_step_ends(step_ends, step_cpu),
            "rewards": rewards,
            "model": model,
            "generate_s": gen_s,
            "update_s": update_s,
        }
    finally:
        engine.stop()


async def _evaluate(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, tasks: list[dict[str, Any]], max_tokens: int
) -> dict[str, float]:
    """Held-out reward of `model`, sampled at temperature 1 and greedy, one engine for both sides."""
    stops = stop_ids(tokenizer)
    engine = Engine(model, tokenizer, max_batch_size=128, max_seq_len=512, seed=1234)
    engine.start()
    try:
        prompts = [
            list(tokenizer(prompt_text(tokenizer, t["question"]), add_special_tokens=False)["input_ids"])
            for t in tasks
        ]
        out: dict[str, float] = {}
        for key, temperature in (("sampled", 1.0), ("greedy", 0.0)):
            sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens, stop_token_ids=stops)
            results = await asyncio.gather(*(engine.generate(p, sampling) for p in prompts))
            hits = [
                first_tool_expression(str(tokenizer.decode(r.token_ids, skip_special_tokens=False)))
                == t["expected"]
                for r, t in zip(results, tasks, strict=True)
            ]
            out[key] = sum(hits) / len(hits)
        return out
    finally:
        engine.stop()


def evaluate(
    model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, tasks: list[dict[str, Any]], max_tokens: int
) -> dict[str, float]:
    model.eval()
    return asyncio.run(_evaluate(model, tokenizer, tasks, max_tokens))


def tail_mean(values: list[float], n: int = 5) -> float:
    return sum(values[-n:]) / len(values[-n:]) if values else float("nan")


def steps_per_second(step_ends: list[float]) -> float:
    """Steady-state steps/s: the first step (one-time warm-up on every side) is left out when there are
    at least three steps; with fewer, all steps over the whole time."""
    if len(step_ends) >= 3:
        return (len(step_ends) - 1) / (step_ends[-1] - step_ends[0])
    return len(step_ends) / step_ends[-1] if step_ends else float("nan")


def report(
    name: str, step_ends: list[float], rewards: list[float], held: dict[str, float], load: float
) -> float:
    """Print one side's line; returns its steady-state steps/s."""
    steps, seconds = len(step_ends), (step_ends[-1] if step_ends else float("nan"))
    rate = steps_per_second(step_ends)
    first = rewards[0] if rewards else float("nan")
    print(
        f"{name}: {steps} steps in {seconds:.1f} s, {rate:.3f} steps/s after the first step; train reward "
        f"first {first:.3f} last-5 {tail_mean(rewards):.3f}; held-out sampled {held['sampled']:.3f} "
        f"greedy {held['greedy']:.3f} (load average after {load:.1f})"
    )
    return rate


def print_cpu(
    cpu: StepCpu | None, children: str = "child processes", *, with_ceiling: bool = False
) -> float | None:
    """Print a side's CPU per step and, `with_ceiling`, the most steps/s that CPU allows with every
    core busy (no scheduling does better: what waits on nothing still needs its CPU); returns it."""
    if cpu is None:
        return None
    print(cpu.line(children))
    if not with_ceiling or cpu.per_step <= 0:
        return None
    ceiling = (os.cpu_count() or 1) / cpu.per_step
    print(f"  at that CPU per step, {os.cpu_count()} busy cores allow at most {ceiling:.3f} steps/s")
    return ceiling


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="15 s per side, 32 held-out questions (smoke run)"
    )
    parser.add_argument("--seconds", type=float, default=None, help="training wall time per side")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--prompts-per-step", type=int, default=16)
    parser.add_argument("--learning-rate", type=float, default=5e-4)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--eval-size", type=int, default=None)
    parser.add_argument("--warm-start", type=Path, default=None, help="model folder (default: the demo's)")
    parser.add_argument("--skip-trl", action="store_true", help="only reinforge's sides (prints no ratio)")
    parser.add_argument("--skip-core", action="store_true", help="skip the engine + Policy.update side")
    parser.add_argument(
        "--skip-overlap", action="store_true", help="skip the Trainer.fit side with overlap_rollouts=True"
    )
    parser.add_argument(
        "--skip-openai-agent",
        action="store_true",
        help="skip the Trainer.fit side whose agent calls through the OpenAI SDK",
    )
    parser.add_argument(
        "--runner-processes",
        type=int,
        default=2,
        help="reinforge's TrainerConfig.runners.processes (0: agents in the trainer's process)",
    )
    parser.add_argument(
        "--runner-nice",
        type=int,
        default=None,
        help="reinforge's TrainerConfig.runners.processes_nice (default: the Trainer's)",
    )
    parser.add_argument(
        "--engine-process",
        choices=["on", "off"],
        default="on",
        help="reinforge's TrainerConfig.engine.process: the engine in its own child process",
    )
    parser.add_argument(
        "--trl-threads", type=int, default=2, help="torch threads of the TRL side (default: both cores)"
    )
    parser.add_argument("--seed", type=int, default=0)
    return parser


def main() -> None:
    args = build_parser().parse_args()
    args.seconds = args.seconds or (15.0 if args.quick else 120.0)
    eval_size = args.eval_size or (32 if args.quick else 200)
    torch.set_num_threads(1)  # one thread per process: the machine's 2 cores are shared

    work = ROOT / ".bench" / "work" / "trainer-bench"
    work.mkdir(parents=True, exist_ok=True)
    warm = resolve_warm_start(args.warm_start)
    model, tokenizer = load_warm_start(warm)
    start_dir = work / "start-model"
    shutil.rmtree(start_dir, ignore_errors=True)
    model.save_pretrained(start_dir, safe_serialization=True)
    tokenizer.save_pretrained(start_dir)
    train = single_turn_tasks("train", 4000, args.seed)
    held_out = single_turn_tasks("val", eval_size, 1)
    print(
        f"trainer_bench: warm start {warm}; {args.prompts_per_step} prompts x group {args.group_size} "
        f"per step, lr {args.learning_rate}, max_tokens {args.max_tokens}, {args.seconds:g} s per side, "
        f"torch threads 1 per process (TRL {args.trl_threads}), reinforge runner processes "
        f"{args.runner_processes}, engine process {args.engine_process}, "
        f"load average {os.getloadavg()[0]:.1f} (2 cores, shared)"
    )
    before = evaluate(model, tokenizer, held_out, args.max_tokens)
    print(
        f"start model, held-out first-call reward: sampled {before['sampled']:.3f} "
        f"greedy {before['greedy']:.3f}"
    )

    # Sides run one after the other (never together: they would share the two cores).
    trl = None if args.skip_trl else run_trl(start_dir, tokenizer, train, args, work)
    trl_load = os.getloadavg()[0]
    core = None if args.skip_core else run_core(model, tokenizer, train, args)
    core_load = os.getloadavg()[0]
    ours = run_reinforge(copy.deepcopy(model), tokenizer, train, args, work)
    ours_load = os.getloadavg()[0]
    sdk = (
        None
        if args.skip_openai_agent
        else run_reinforge(copy.deepcopy(model), tokenizer, train, args, work, openai_agent=True)
    )
    sdk_load = os.getloadavg()[0]
    overlap = (
        None
        if args.skip_overlap
        else run_reinforge(copy.deepcopy(model), tokenizer, train, args, work, overlap=True)
    )
    overlap_load = os.getloadavg()[0]

    children = "runner and engine processes" if args.engine_process == "on" else "runner processes"

    def report_side(name: str, side: dict[str, Any], load: float) -> float:
        """`report` for one of reinforge's sides: its held-out success evaluated here."""
        held = evaluate(side["model"], tokenizer, held_out, args.max_tokens)
        return report(name, side["step_ends"], side["rewards"], held, load)

    ours_rate = report_side("reinforge Trainer.fit (store + gateway + engine + runner)", ours, ours_load)
    print(f"  of which rollouts {ours['rollout_s']:.1f} s, policy updates {ours['update_s']:.1f} s")
    ceiling = print_cpu(ours["cpu"], children, with_ceiling=True)
    question, recorded = ours["recorded_prompt"]
    same = bool(recorded) and recorded == list(
        tokenizer(prompt_text(tokenizer, question), add_special_tokens=False)["input_ids"]
    )
    print(f"prompt check: the gateway recorded {'the same' if same else 'DIFFERENT'} token ids TRL gets")
    sdk_rate = sdk_ceiling = None
    if sdk is not None:
        sdk_rate = report_side("reinforge Trainer.fit, the agent on the OpenAI SDK", sdk, sdk_load)
        print(f"  of which rollouts {sdk['rollout_s']:.1f} s, policy updates {sdk['update_s']:.1f} s")
        sdk_ceiling = print_cpu(sdk["cpu"], children, with_ceiling=True)
    overlap_rate = None
    if overlap is not None:
        overlap_rate = report_side("reinforge Trainer.fit, overlap_rollouts=True", overlap, overlap_load)
        print(
            f"  of which waiting for rollouts {overlap['rollout_s']:.1f} s, "
            f"policy updates {overlap['update_s']:.1f} s"
        )
        print_cpu(overlap["cpu"], children)
    core_rate = None
    if core is not None:
        core_rate = report_side("reinforge core (engine + Policy.update, no spine)", core, core_load)
        print(f"  of which generation {core['generate_s']:.1f} s, policy updates {core['update_s']:.1f} s")
        print_cpu(core["cpu"])
    if trl is None:
        print("TRL skipped (--skip-trl): no ratio")
        return
    if isinstance(trl, str):
        print(f"TRL baseline unavailable: {trl}")
        return
    from transformers import AutoModelForCausalLM

    trl_model = AutoModelForCausalLM.from_pretrained(trl["final_model_dir"], dtype=torch.float32)
    trl_rate = report(
        f"TRL {trl['trl_version']} GRPOTrainer",
        trl["step_ends_s"],
        trl["rewards"],
        evaluate(trl_model, tokenizer, held_out, args.max_tokens),
        trl_load,
    )
    if "generate_s" in trl:
        print(f"  of which generation {trl['generate_s']:.1f} s (HF generate), the rest the policy update")
    print_cpu(from_step_ends(trl["step_ends_s"], trl.get("step_cpu_s") or []))
    if core_rate is not None:
        print(f"core steps/s vs TRL: {core_rate / trl_rate:.2f}x")
        print(f"RESULT trainer_core_steps_per_s_ratio_vs_trl={core_rate / trl_rate:.2f}")
    if overlap_rate is not None:
        print(f"Trainer.fit (overlap_rollouts) steps/s vs TRL: {overlap_rate / trl_rate:.2f}x")
        print(f"RESULT trainer_overlap_steps_per_s_ratio_vs_trl={overlap_rate / trl_rate:.2f}")
    if sdk_rate is not None:
        if sdk_ceiling is not None:
            print(f"Trainer.fit (OpenAI SDK agent) CPU ceiling vs TRL: {sdk_ceiling / trl_rate:.2f}x")
        print(f"Trainer.fit (OpenAI SDK agent) steps/s vs TRL: {sdk_rate / trl_rate:.2f}x")
        print(f"RESULT trainer_openai_agent_steps_per_s_ratio_vs_trl={sdk_rate / trl_rate:.2f}")
    if ceiling is not None:
        print(f"Trainer.fit CPU ceiling vs TRL: {ceiling / trl_rate:.2f}x")
    print(f"Trainer.fit steps/s vs TRL: {ours_rate / trl_rate:.2f}x")
    print(f"RESULT trainer_steps_per_s_ratio_vs_trl={ours_rate / trl_rate:.2f}")
    if args.quick:
        print("(--quick: a few steps per side on a shared machine; a smoke run, not a measurement)")


if __name__ == "__main__":
    main()
