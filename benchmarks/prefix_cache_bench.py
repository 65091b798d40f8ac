"""Prefix reuse across requests: the engine's retained caches of finished sequences, against sharing
only with running sequences, and against no prefix reuse at all.

The workload is the Text-to-SQL agent's (examples/sql) in a GRPO step, built from the example's real
validation tasks: `--tasks` tasks (a few database schemas, several questions on each) x `--samples`
rollouts send the writer prompt "<schema>\\nQ: <question>" all at once; when those are done, each
rollout sends the rewriter prompt, which extends its writer prompt and completion by
"\\nRows: <preview>\\nFix:" (token ids appended, as a multi-turn agent's next call is). Between steps
the same weights are loaded again, as a policy update would (it drops every retained cache). Three
engines serve it, one after another in each round and in alternating order (ABC, CBA, ...), so a
change of machine load hits all alike:

- `off`: `prefix_min_tokens=0`, every prompt token is computed;
- `running-only`: `retain_prefixes=False`, prompts copy prefixes from sequences still running (the
  rollouts of one task share their prompt);
- `retain`: the default, prompts also copy from finished sequences' retained caches (the rewriter
  prompt copies its writer call's prompt and completion).

The model is a tiny Llama (hidden 128, 4 layers) on the example's tokenizer with random weights and
EOS masked out, decoding greedily for exactly `--max-tokens` tokens, so every engine decodes the same
number of tokens and only prefill differs; the script checks the completions agree. A second workload
with the same prompt lengths but random unique prompts (nothing to share) measures what the
bookkeeping costs: `retain` against `off`.

    .venv/bin/python benchmarks/prefix_cache_bench.py [--quick] [--threads N]

Prints prefill tokens computed and wall and CPU seconds per engine, then
`RESULT prefix_cache_speedup_vs_off=<off wall / retain wall>`,
`RESULT prefix_retention_speedup_vs_running_only=<running-only wall / retain wall>`,
`RESULT prefix_cache_prefill_tokens_saved_pct=<prefill tokens not computed by retain, % of off's>` and
`RESULT prefix_cache_overhead_unique_prompts=<retain wall / off wall on unique prompts>` (~1 is good).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
import transformers

from reinforge.engine import Engine
from reinforge.inference.contract import SamplingParams
from reinforge.models import build_tokenizer, tiny_llama

sys.path.insert(0, "examples/sql")
import sql_data

SIDES: dict[str, dict[str, Any]] = {
    "off": {"prefix_min_tokens": 0},
    "running-only": {"retain_prefixes": False},
    "retain": {},
}
PROMPT_MARKERS = ["\nQ: ", "\nSQL: ", "\nRows: ", "\nFix:"]


@dataclass
class Call:
    """One rollout's two LLM calls: the writer prompt, and what the rewriter prompt appends to the
    writer prompt + completion."""

    writer: list[int]
    suffix: list[int]


@dataclass
class Totals:
    wall: float = 0.0
    cpu: float = 0.0
    prompt_tokens: int = 0
    cached: int = 0
    retained_hits: int = 0
    outputs: list[list[int]] = field(default_factory=list)

    @property
    def computed(self) -> int:
        return self.prompt_tokens - self.cached


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a smaller run (well under a minute on a CPU)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tasks", type=int, default=16)
    ap.add_argument("--samples", type=int, default=8, help="rollouts per task (a GRPO group)")
    ap.add_argument("--schemas", type=int, default=4, help="databases the tasks are drawn from")
    ap.add_argument("--steps", type=int, default=2, help="GRPO steps per measured run")
    ap.add_argument("--rounds", type=int, default=2, help="alternating rounds (ABC, CBA, ...)")
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="0: greedy (a group's rollouts are identical); >0: seeded sampling, rollouts differ",
    )
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.quick:
        args.tasks, args.samples, args.steps = 8, 4, 1
    return args


def build_model(tok: Any) -> torch.nn.Module:
    """The example's model shape with random weights and an untied head that never picks EOS, so every
    completion is exactly max_tokens long."""
    model = tiny_llama(tok, hidden_size=128, num_layers=4, num_heads=4, intermediate_size=512)
    head = torch.nn.Linear(128, len(tok), bias=True)
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, torch.nn.Embedding)
    with torch.no_grad():
        head.weight.copy_(embedding.weight)
        head.bias.zero_()
        head.bias[tok.eos_token_id] = -1e4
    model.lm_head = head
    model.config.tie_word_embeddings = False
    return model.eval()


def sql_steps(args: argparse.Namespace, tok: Any) -> list[list[Call]]:
    """Per step, `tasks` tasks from `schemas` databases (different questions each step)."""
    by_db: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for task in sql_data.val_tasks():
        by_db[task["db_id"]].append(task)
    dbs = sorted(by_db, key=lambda d: (-len(by_db[d]), d))[: args.schemas]
    per_db = -(-args.tasks // len(dbs))
    rng = random.Random(args.seed)
    steps = []
    for step in range(args.steps):
        tasks = [t for d in dbs for t in by_db[d][step * per_db : (step + 1) * per_db]][: args.tasks]
        calls = []
        for task in tasks:
            writer = tok(f"{task['schema']}\nQ: {task['question']}", add_special_tokens=False)["input_ids"]
            preview = f"{rng.randint(0, 9)} rows: {rng.randint(1, 500)}, {rng.randint(1, 500)}"
            suffix = tok(f"\nRows: {preview}\nFix:", add_special_tokens=False)["input_ids"]
            calls += [Call([tok.bos_token_id, *writer], suffix)] * args.samples
        steps.append(calls)
    return steps


def unique_steps(steps: list[list[Call]], vocab: int, seed: int) -> list[list[Call]]:
    """The same prompt lengths with random tokens: no two prompts share a prefix worth copying."""
    rng = random.Random(seed)
    return [
        [
            Call([rng.randrange(16, vocab) for _ in c.writer], [rng.randrange(16, vocab) for _ in c.suffix])
            for c in s
        ]
        for s in steps
    ]


async def serve(
    engine: Engine, steps: list[list[Call]], args: argparse.Namespace, unique: bool, state: Any
) -> list[list[int]]:
    """Each step: every writer call at once, then every rewriter call at once, then a weight load.
    With `unique`, a rewriter prompt is random too (it extends nothing). Sampled calls carry their
    own seed, so every engine draws the same completions."""
    max_tokens = args.max_tokens

    def params(seed: int) -> SamplingParams:
        return SamplingParams(temperature=args.temperature, max_tokens=max_tokens, seed=seed)

    rng = random.Random(1)
    outputs: list[list[int]] = []
    for version, calls in enumerate(steps, start=1):
        base = 2 * version * len(calls)
        writes = await asyncio.gather(
            *(engine.generate(c.writer, params(base + i)) for i, c in enumerate(calls))
        )
        if unique:
            rewrites = [
                [rng.randrange(16, engine.vocab_size) for _ in range(len(c.writer) + max_tokens)] + c.suffix
                for c in calls
            ]
        else:
            rewrites = [c.writer + w.token_ids + c.suffix for c, w in zip(calls, writes, strict=True)]
        fixes = await asyncio.gather(
            *(engine.generate(p, params(base + len(calls) + i)) for i, p in enumerate(rewrites))
        )
        outputs += [o.token_ids for o in (*writes, *fixes)]
        await engine.load_weights(state, version=version)
    return outputs


def measure(
    model: torch.nn.Module,
    tok: Any,
    side: str,
    steps: list[list[Call]],
    args: argparse.Namespace,
    unique: bool,
) -> Totals:
    batch = max(len(s) for s in steps)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    with Engine(model, tok, max_batch_size=batch, max_seq_len=512, **SIDES[side]) as engine:
        start, cpu = time.perf_counter(), time.process_time()
        outputs = asyncio.run(serve(engine, steps, args, unique, state))
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
        stats = engine.stats()
    prompts = sum(len(c.writer) * 2 + args.max_tokens + len(c.suffix) for s in steps for c in s)
    return Totals(wall, cpu, prompts, stats["prefix_cached_tokens"], stats["prefix_retained_hits"], outputs)


def add(a: Totals, b: Totals) -> Totals:
    return Totals(
        a.wall + b.wall,
        a.cpu + b.cpu,
        a.prompt_tokens + b.prompt_tokens,
        a.cached + b.cached,
        a.retained_hits + b.retained_hits,
        b.outputs,
    )


def rounds(
    model: torch.nn.Module,
    tok: Any,
    sides: list[str],
    steps: list[list[Call]],
    args: argparse.Namespace,
    unique: bool,
) -> dict[str, Totals]:
    totals = {side: Totals() for side in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else sides[::-1]:
            totals[side] = add(totals[side], measure(model, tok, side, steps, args, unique))
    return totals


def report(title: str, totals: dict[str, Totals]) -> None:
    reference = totals["off"].outputs
    print(title)
    print(
        f"{'engine':>13} {'wall s':>8} {'cpu s':>8} {'prefill computed':>17} {'of':>7} "
        f"{'from batch':>13} {'from retained':>14} {'same output':>12}"
    )
    for side, t in totals.items():
        same = sum(a == b for a, b in zip(t.outputs, reference, strict=True))
        print(
            f"{side:>13} {t.wall:>8.2f} {t.cpu:>8.2f} {t.computed:>17} {t.prompt_tokens:>7} "
            f"{t.cached - t.retained_hits:>13} {t.retained_hits:>14} {same:>6}/{len(reference)}"
        )


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    lines = sql_data.corpus_text(sql_data.train_tasks()).splitlines()
    tok = build_tokenizer(lines, vocab_size=1024, special_tokens=PROMPT_MARKERS)
    model = build_model(tok)
    steps = sql_steps(args, tok)
    lens = [len(c.writer) for s in steps for c in s]
    print(
        f"model: Llama hidden=128 layers=4 params={sum(p.numel() for p in model.parameters()) / 1e6:.2f}M "
        f"float32 torch threads={args.threads}; vocab {len(tok)}"
    )
    print(
        f"workload: {args.steps} step(s) x {args.tasks} tasks on {args.schemas} schemas x {args.samples} "
        f"rollouts; writer prompts {min(lens)}-{max(lens)} tokens, then rewriter prompts extending them; "
        f"temperature {args.temperature}, {args.max_tokens} tokens each; {args.rounds} alternating rounds"
    )
    measure(model, tok, "retain", steps[:1], argparse.Namespace(**{**vars(args), "max_tokens": 2}), False)

    sql = rounds(model, tok, list(SIDES), steps, args, unique=False)
    report("SQL agent workload (shared schemas, rewriter extends writer):", sql)
    unique = rounds(
        model, tok, ["off", "retain"], unique_steps(steps, len(tok), args.seed), args, unique=True
    )
    report("unique prompts, same lengths (nothing to share):", unique)
    print("(prefill computed: prompt tokens run through the model; the rest were copied from caches:")
    print(" from batch = from running sequences or prompts admitted with it, from retained = finished ones)")
    print(
        f"(cpu seconds on the SQL workload: off / retain {sql['off'].cpu / sql['retain'].cpu:.2f}x, "
        f"running-only / retain {sql['running-only'].cpu / sql['retain'].cpu:.2f}x; "
        f"on unique prompts retain / off {unique['retain'].cpu / unique['off'].cpu:.2f}x)"
    )
    saved = 100 * (1 - sql["retain"].computed / sql["off"].computed)
    print(f"RESULT prefix_cache_speedup_vs_off={sql['off'].wall / sql['retain'].wall:.2f}")
    print(
        f"RESULT prefix_retention_speedup_vs_running_only={sql['running-only'].wall / sql['retain'].wall:.2f}"
    )
    print(f"RESULT prefix_cache_prefill_tokens_saved_pct={saved:.1f}")
    print(f"RESULT prefix_cache_overhead_unique_prompts={unique['retain'].wall / unique['off'].wall:.2f}")


if __name__ == "__main__":
    main()
