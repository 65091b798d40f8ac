"""Live weight updates: applied between steps, never mixing versions inside one response."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams

from .conftest import diversify, hf_greedy, prompts


async def test_cpu_load_weights_switches_versions_without_mixing(
    llama: torch.nn.Module, tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    old = copy.deepcopy(llama)
    new = diversify(copy.deepcopy(llama), seed=99)
    engine = make_engine(copy.deepcopy(old), tokenizer, max_batch_size=4, policy_version=3)
    batch = prompts(tokenizer, 8)
    greedy = SamplingParams(temperature=0, max_tokens=30)

    before = [asyncio.create_task(engine.generate(p, greedy)) for p in batch[:4]]
    while engine.stats()["running"] < 4:
        await asyncio.sleep(0.001)
    update = asyncio.create_task(engine.load_weights(new.state_dict(), version=4))
    await asyncio.sleep(0.01)
    after = [asyncio.create_task(engine.generate(p, greedy)) for p in batch[4:]]
    await update
    assert engine.policy_version == 4

    for p, task in zip(batch[:4], before, strict=True):
        out = task.result()
        assert out.policy_version == 3
        assert out.token_ids == hf_greedy(old, p, 30, tokenizer.eos_token_id)
    for p, task in zip(batch[4:], after, strict=True):
        out = await task
        assert out.policy_version == 4
        assert out.token_ids == hf_greedy(new, p, 30, tokenizer.eos_token_id)


async def test_cpu_load_weights_from_a_saved_folder_and_file(
    llama: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
    tmp_path: Path,
) -> None:
    new = diversify(copy.deepcopy(llama), seed=7)
    new.save_pretrained(tmp_path / "ckpt")
    torch.save(new.state_dict(), tmp_path / "weights.pt")
    p = prompts(tokenizer, 1)[0]
    expected = hf_greedy(new, p, 20, tokenizer.eos_token_id)
    for source, version in ((tmp_path / "ckpt", 1), (str(tmp_path / "weights.pt"), 2)):
        engine = make_engine(copy.deepcopy(llama), tokenizer)
        await engine.load_weights(source, version=version)
        out = await engine.generate(p, SamplingParams(temperature=0, max_tokens=20))
        assert (out.policy_version, out.token_ids) == (version, expected)


async def test_cpu_bad_weight_updates_are_rejected_and_serving_goes_on(
    llama: torch.nn.Module,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
    tmp_path: Path,
) -> None:
    engine = make_engine(copy.deepcopy(llama), tokenizer, policy_version=5)
    with pytest.raises(InvalidRequestError, match="does not have"):
        await engine.load_weights({"not.a.weight": torch.zeros(2)}, version=6)
    name, tensor = next(iter(llama.state_dict().items()))
    with pytest.raises(InvalidRequestError, match="wrong shapes"):
        await engine.load_weights({name: torch.zeros(tensor.shape[0] + 1)}, version=6)
    with pytest.raises(InvalidRequestError, match="does not exist"):
        await engine.load_weights(tmp_path / "missing.safetensors", version=6)
    out = await engine.generate(prompts(tokenizer, 1)[0], SamplingParams(temperature=0, max_tokens=5))
    assert out.policy_version == 5
