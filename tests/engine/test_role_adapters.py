"""Named LoRA adapters in the engine: rows of different adapters decode in one batch, each exactly as
peft computes that adapter; prefix sharing never crosses adapters; unknown names get the base."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from peft import LoraConfig, get_peft_model
from peft.tuners.lora import LoraLayer
from transformers import PreTrainedTokenizerFast

from reinforge.engine import Engine, EngineOutput
from reinforge.engine.adapters import lora_key
from reinforge.engine.process import EngineProcess
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import SamplingParams

from .conftest import prompts

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def randomize(peft_model: Any, adapter: str, seed: int) -> None:
    """Non-zero B (peft starts it at zero, which would make every adapter the base)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for module in peft_model.modules():
            if isinstance(module, LoraLayer) and adapter in module.lora_B:
                module.lora_B[adapter].weight.normal_(0.0, 0.2, generator=gen)
                module.lora_A[adapter].weight.normal_(0.0, 0.2, generator=gen)


def adapter_state(peft_model: Any, adapters: list[str]) -> dict[str, torch.Tensor]:
    """The engine's weight names for these adapters' tensors (`lora/<adapter>/<module>.<part>`)."""
    state: dict[str, torch.Tensor] = {}
    for path, module in peft_model.get_base_model().named_modules():
        if isinstance(module, LoraLayer):
            for name in (n for n in adapters if n in module.lora_A):
                state[lora_key(name, path, "lora_A")] = module.lora_A[name].weight.detach().clone()
                state[lora_key(name, path, "lora_B")] = module.lora_B[name].weight.detach().clone()
                state[lora_key(name, path, "scale")] = torch.tensor(float(module.scaling[name]))
    return state


@pytest.fixture
def peft_model(llama: torch.nn.Module) -> Any:
    """Adapters "a" (r=4, all projections) and "b" (r=2, attention only) on a copy of the base."""
    model = get_peft_model(
        copy.deepcopy(llama),  # type: ignore[arg-type]
        LoraConfig(r=4, lora_alpha=8, target_modules=TARGETS),
        adapter_name="alpha",
    )
    model.add_adapter("beta", LoraConfig(r=2, lora_alpha=6, target_modules=["q_proj", "v_proj", "o_proj"]))
    randomize(model, "alpha", 1)
    randomize(model, "beta", 2)
    return model.eval()


def reference(peft_model: Any, adapter: str | None, prompt: list[int], tokens: list[int]) -> torch.Tensor:
    """Teacher-forced log-softmax rows of peft's forward with `adapter` (None: adapters disabled)."""
    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        if adapter is None:
            with peft_model.disable_adapter():
                logits = peft_model(ids).logits
        else:
            peft_model.set_adapter(adapter)
            logits = peft_model(ids).logits
    return logits[0, len(prompt) - 1 : -1].float()


def assert_served_by(
    peft_model: Any,
    adapter: str | None,
    prompt: list[int],
    tokens: list[int],
    logprobs: list[float],
    eos: int,
) -> None:
    rows = reference(peft_model, adapter, prompt, tokens)
    rows[:, eos] -= 100.0  # the requests bias EOS away; greedy records the biased logits at temperature 1
    expected = torch.log_softmax(rows, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    assert torch.allclose(expected, torch.tensor(logprobs), atol=1e-4), (adapter, expected, logprobs)
    assert rows.argmax(dim=-1).tolist() == tokens


def greedy(tokenizer: PreTrainedTokenizerFast, max_tokens: int = 8) -> SamplingParams:
    """Greedy, never ending early (EOS biased away)."""
    return SamplingParams(temperature=0, max_tokens=max_tokens, logit_bias={tokenizer.eos_token_id: -100.0})


async def test_cpu_rows_of_two_adapters_and_the_base_decode_in_one_batch(
    llama: torch.nn.Module,
    peft_model: Any,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(copy.deepcopy(llama), tokenizer, max_batch_size=8, prefix_min_tokens=0)
    assert engine.uses_fast_path
    await engine.load_weights(adapter_state(peft_model, ["alpha", "beta"]), version=1)
    assert engine.adapter_names == ["alpha", "beta"]
    rows = list(zip(prompts(tokenizer, 6), ["alpha", "beta", None, "beta", "alpha", None], strict=True))
    outs = await asyncio.gather(*(engine.generate(p, greedy(tokenizer), adapter=a) for p, a in rows))
    assert engine.stats()["peak_running"] == 6  # they decoded together
    for (prompt, adapter), out in zip(rows, outs, strict=True):
        assert out.policy_version == 1
        assert_served_by(peft_model, adapter, prompt, out.token_ids, out.logprobs, tokenizer.eos_token_id)
    # The adapters really change the output: the same prompt differs under each.
    same = await asyncio.gather(
        *(engine.generate(rows[0][0], greedy(tokenizer), adapter=a) for a in ("alpha", "beta", None))
    )
    assert len({tuple(round(x, 4) for x in out.logprobs) for out in same}) == 3
    stats = engine.stats()
    assert (
        stats["adapter_sequences/alpha"],
        stats["adapter_sequences/beta"],
        stats["adapter_sequences/"],
    ) == (3, 3, 3)


async def test_cpu_prefix_sharing_stays_within_an_adapter(
    llama: torch.nn.Module,
    peft_model: Any,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(
        copy.deepcopy(llama), tokenizer, max_batch_size=8, prefix_min_tokens=4, retain_prefixes=False
    )
    await engine.load_weights(adapter_state(peft_model, ["alpha", "beta"]), version=1)
    prompt = [
        tokenizer.bos_token_id,
        *tokenizer("What is 12 plus 30? It is 42. What is 3 plus 4?")["input_ids"],
    ]
    adapters = ["alpha", "beta", None, "alpha"]
    outs = await asyncio.gather(*(engine.generate(prompt, greedy(tokenizer), adapter=a) for a in adapters))
    for adapter, out in zip(adapters, outs, strict=True):
        assert_served_by(peft_model, adapter, prompt, out.token_ids, out.logprobs, tokenizer.eos_token_id)
    assert outs[0].logprobs != outs[1].logprobs != outs[2].logprobs
    # Only the second "alpha" copied a prefix (from the first): every token but its last.
    assert engine.stats()["prefix_cached_tokens"] == len(prompt) - 1

    # A conversation going on: the next prompt extends a running sequence's tokens, but under
    # another adapter it must be computed in full.
    longer = prompt + outs[0].token_ids
    before = engine.stats()["prefix_cached_tokens"]
    running = asyncio.ensure_future(engine.generate(prompt, greedy(tokenizer, 30), adapter="alpha"))
    while engine.stats()["running"] == 0:
        await asyncio.sleep(0.001)
    cont = await engine.generate(longer, greedy(tokenizer), adapter="beta")
    await running
    assert_served_by(peft_model, "beta", longer, cont.token_ids, cont.logprobs, tokenizer.eos_token_id)
    # Nothing else was running when "alpha" started, and "beta" must not copy from "alpha".
    assert engine.stats()["prefix_cached_tokens"] == before


async def test_cpu_an_unknown_adapter_is_served_by_the_base(
    llama: torch.nn.Module,
    peft_model: Any,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(copy.deepcopy(llama), tokenizer, max_batch_size=4)
    prompt = prompts(tokenizer, 2)[1]
    plain = await engine.generate(prompt, greedy(tokenizer), adapter="checker")  # no adapters at all
    await engine.load_weights(adapter_state(peft_model, ["alpha"]), version=1)
    frozen = await engine.generate(prompt, greedy(tokenizer), adapter="checker")
    assert plain.logprobs == frozen.logprobs
    assert_served_by(peft_model, None, prompt, frozen.token_ids, frozen.logprobs, tokenizer.eos_token_id)
    assert engine.stats()["adapter_sequences/"] == 2


async def test_cpu_reloading_an_adapter_takes_effect_and_bad_ones_are_refused(
    llama: torch.nn.Module,
    peft_model: Any,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    engine = make_engine(copy.deepcopy(llama), tokenizer, max_batch_size=4)
    await engine.load_weights(adapter_state(peft_model, ["alpha", "beta"]), version=1)
    prompt = prompts(tokenizer, 3)[2]
    first = await engine.generate(prompt, greedy(tokenizer), adapter="alpha")
    randomize(peft_model, "alpha", 7)  # a training step moved "alpha"; "beta" is not republished
    await engine.load_weights(adapter_state(peft_model, ["alpha"]), version=2)
    after = await asyncio.gather(
        *(engine.generate(prompt, greedy(tokenizer), adapter=a) for a in ("alpha", "beta"))
    )
    assert after[0].logprobs != first.logprobs and after[0].policy_version == 2
    for adapter, out in zip(("alpha", "beta"), after, strict=True):
        assert_served_by(peft_model, adapter, prompt, out.token_ids, out.logprobs, tokenizer.eos_token_id)

    state = adapter_state(peft_model, ["alpha"])
    key = next(k for k in state if k.endswith("q_proj.lora_B"))
    with pytest.raises(InvalidRequestError, match="do not fit"):
        await engine.load_weights({**state, key: state[key][:, :1]}, version=3)
    nowhere = {lora_key("alpha", "model.nowhere", part): state[key] for part in ("lora_A", "lora_B", "scale")}
    with pytest.raises(InvalidRequestError, match="not a linear layer"):
        await engine.load_weights({**state, **nowhere}, 3)
    with pytest.raises(InvalidRequestError, match="lacks"):
        await engine.load_weights(
            {lora_key("alpha", "model.layers.0.mlp.up_proj", "scale"): torch.tensor(1.0)}, 3
        )
    assert engine.policy_version == 2  # refused updates change nothing


async def test_cpu_the_engine_process_serves_adapters(
    llama: torch.nn.Module, peft_model: Any, tokenizer: PreTrainedTokenizerFast
) -> None:
    prompt = prompts(tokenizer, 4)[3]
    with EngineProcess(copy.deepcopy(llama), tokenizer, max_batch_size=4, torch_threads=1) as engine:
        await engine.load_weights(adapter_state(peft_model, ["alpha", "beta"]), version=1)  # shared buffer
        outs = await asyncio.gather(
            *(engine.generate(prompt, greedy(tokenizer), adapter=a) for a in ("beta", None))
        )
        streamed = [item async for item in engine.stream(prompt, greedy(tokenizer), adapter="alpha")][-1]
    assert isinstance(streamed, EngineOutput)
    for adapter, out in zip(("beta", None, "alpha"), [*outs, streamed], strict=True):
        assert_served_by(peft_model, adapter, prompt, out.token_ids, out.logprobs, tokenizer.eos_token_id)
