"""`reinforge sft config.toml`: a warm start built from the agent's own recorded conversations.

The run file's `[warm_start]` section names an untrained base model, a scripted policy and where the
traces go. The agent of `[agent]` runs unchanged on the `[data] train` tasks against that policy (so
its framework renders every prompt exactly as it will during RL), the gateway records each call's
token ids, and the base model is trained on those ids. The RL run then starts from the saved folder.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reinforge.errors import InvalidRequestError
from reinforge.inference.scripted import ScriptedBackend
from reinforge.stack.settings import MODEL_NAME
from reinforge.store.factory import open_store
from reinforge.training.collect import (
    CollectReport,
    collect_traces,
    recorded_rollouts,
    recorded_tokenizers,
    tokenizer_fingerprint,
    trace_examples,
)
from reinforge.training.memory import returning_freed_memory
from reinforge.training.run_config import (
    RunConfig,
    WarmStartSection,
    load_callable,
    load_dataset,
    load_model_spec,
    resolve_agent,
)
from reinforge.training.sft import SftReport, supervised_finetune
from reinforge.training.sft_rewrite import RewritingExamples


class WarmStartReport(BaseModel):
    collected: CollectReport | None
    """None when the store already held traces and none were recorded."""
    examples: int
    sft: SftReport
    out_dir: Path


def section(config: RunConfig) -> WarmStartSection:
    if config.warm_start is None:
        raise InvalidRequestError("the run file has no [warm_start] section (see docs/training.md)")
    return config.warm_start


def load_base(config: RunConfig) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The untrained model and its tokenizer, however `[warm_start] base` names them."""
    found, tokenizer = load_model_spec(section(config).base, config.base_dir)
    if isinstance(found, str | Path):  # a folder, or a hub id from_pretrained resolves
        if isinstance(found, Path) and not found.is_dir():
            raise InvalidRequestError(f"[warm_start] base {found} is neither a folder nor 'module:function'")
        return AutoModelForCausalLM.from_pretrained(
            str(found), dtype=torch.float32
        ), AutoTokenizer.from_pretrained(str(found))
    if tokenizer is None:
        raise InvalidRequestError("[warm_start] base must give a tokenizer with the model")
    return found, tokenizer


async def build_warm_start(
    config: RunConfig,
    *,
    recollect: bool = False,
    on_step: Callable[[int, float], None] | None = None,
    log: Callable[[str], None] = print,
) -> WarmStartReport:
    """Record traces (unless the store holds some and `recollect` is off), train, save to `out`.

    Without `recollect` every recording in the store is trained on; with it, only the new one."""
    ws = section(config)
    model, tokenizer = load_base(config)
    store = await open_store(ws.store_url(config.base_dir))
    try:
        collected: CollectReport | None = None
        have = await recorded_rollouts(store)
        fingerprint = tokenizer_fingerprint(tokenizer)
        if have and not recollect:
            recorded_with = set((await recorded_tokenizers(store, have)).values())
            if fingerprint not in recorded_with and recorded_with - {None}:
                raise InvalidRequestError(
                    f"the traces in {ws.store} were recorded with another tokenizer than [warm_start] "
                    "base gives: their token ids would train the wrong pieces. Run `reinforge sft "
                    "--recollect` (it records anew) or name a new [warm_start] store"
                )
        if recollect or not have:
            if ws.policy is None:
                raise InvalidRequestError(
                    f"the trace store {ws.store} holds no finished rollouts and [warm_start] names no policy"
                )
            policy = load_callable(ws.policy, config.base_dir, what="policy")
            tasks = load_dataset(config.data.train, config.base_dir)
            backend = ScriptedBackend(tokenizer, policy, model_name=MODEL_NAME, compact_json=ws.compact_json)
            collected = await collect_traces(
                resolve_agent(config),
                tasks[: ws.tasks] if ws.tasks else tasks,
                backend,
                store,
                concurrency=ws.concurrency,
                max_tokens=ws.max_tokens,
                processes=ws.processes,
                log_dir=ws.out_dir(config.base_dir).parent / "logs",
                tokenizer_id=fingerprint,
            )
            log(
                f"recorded {collected.succeeded}/{collected.rollouts} rollouts in {collected.seconds:.0f}s "
                f"(mean reward {collected.mean_reward:.3f})"
            )
        examples = await trace_examples(
            store,
            min_reward=ws.min_reward,
            agents=ws.agents,
            tokenizer_id=fingerprint,
            # a recording made here replaces the store's earlier ones (kept there, not trained on):
            # recording again is what a changed policy or agent asks for, and old traces would mix plans
            resources_version=collected.resources_version if collected is not None else None,
        )
    finally:
        await store.close()
    if not examples:
        raise InvalidRequestError("no recorded call passed the [warm_start] filters: nothing to train on")
    log(f"training on {len(examples)} recorded sequences")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    augment = (
        RewritingExamples(tokenizer, load_callable(ws.rewrite, config.base_dir, what="rewrite"))
        if ws.rewrite
        else None
    )
    with returning_freed_memory(ws.sft.return_freed_memory):
        report = await asyncio.to_thread(
            supervised_finetune, model, examples, ws.sft, pad_id=pad_id, on_step=on_step, augment=augment
        )
    if augment is not None and augment.kept_as_recorded:
        log(f"{augment.kept_as_recorded} drawn examples were used as recorded (ids not lossless as text)")
    out = ws.out_dir(config.base_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return WarmStartReport(collected=collected, examples=len(examples), sft=report, out_dir=out)
