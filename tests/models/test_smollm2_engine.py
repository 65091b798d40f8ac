"""The engine's fast path on a real model: SmolLM2-135M-Instruct (converted from the packaged GGUF) with
continuous batching, prefix reuse across requests sharing a system prompt (read once per decode step
by cascade attention), and a LoRA adapter, each equal to Hugging Face token for token."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from reinforge.engine import Engine
from reinforge.engine.adapters import lora_key
from reinforge.inference.contract import SamplingParams

from .conftest import SMOLLM2

SYSTEM = (
    "You are a support agent for an online store. Answer in one short sentence. Tools you may call: "
    "lookup_order(id) returns an order's items and status; refund_policy(category) returns the refund "
    "rules of a category; create_ticket(team, summary) opens a ticket for a team."
)
QUESTIONS = [
    "My order 1234 never arrived. What should I do?",
    "Can I return a lamp after two weeks?",
    "The kettle I bought is broken.",
    "Where is my package?",
    "I was charged twice for one chair.",
]


@pytest.fixture(scope="module")
def smollm2(smollm2_cache: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    folder = smollm2_cache / SMOLLM2
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return model, AutoTokenizer.from_pretrained(folder)


def _prompt(tokenizer: PreTrainedTokenizerBase, question: str) -> list[int]:
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _hf_greedy(model: PreTrainedModel, prompt: list[int], new_tokens: int) -> list[int]:
    with torch.no_grad():
        out = model.generate(  # type: ignore[operator]
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=2,
        )
    return [int(t) for t in out[0, len(prompt) :]]


async def test_cpu_continuous_batching_and_prefix_reuse_equal_hf(
    smollm2: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tokenizer = smollm2
    prompts = [_prompt(tokenizer, q) for q in QUESTIONS]
    assert len(prompts[0]) > 64  # the shared system prompt is long enough for cascade decode
    budgets = [10, 14, 8, 12, 16]
    with Engine(model, tokenizer, max_batch_size=3, max_seq_len=256) as engine:
        assert engine.uses_fast_path

        async def one(i: int) -> list[int]:
            await asyncio.sleep(0.05 * i)  # later requests join a batch that is already decoding
            out = await engine.generate(prompts[i], SamplingParams(temperature=0.0, max_tokens=budgets[i]))
            return out.token_ids

        got = await asyncio.gather(*(one(i) for i in range(len(prompts))))
        stats = engine.stats()
    for i, prompt in enumerate(prompts):
        assert got[i] == _hf_greedy(model, prompt, budgets[i]), f"request {i}"
    assert stats["prefix_cached_tokens"] >= (len(prompts) - 1) * 64  # the system prompt, copied


async def test_cpu_a_lora_adapter_equals_its_merged_weights(
    smollm2: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    """A random rank-4 adapter on q/v/down of every layer: served next to the base in one batch, each
    request equals HF generate on the base or on a copy with the adapter merged into the weights."""
    model, tokenizer = smollm2
    gen = torch.Generator().manual_seed(0)
    merged = copy.deepcopy(model)
    state: dict[str, torch.Tensor] = {}
    scale = 2.0
    for path, module in model.named_modules():
        if path.endswith(("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")):
            out_features, in_features = module.weight.shape
            a = torch.randn(4, in_features, generator=gen) * 0.05
            b = torch.randn(out_features, 4, generator=gen) * 0.05
            state[lora_key("tuned", path, "lora_A")] = a
            state[lora_key("tuned", path, "lora_B")] = b
            state[lora_key("tuned", path, "scale")] = torch.tensor(scale)
            with torch.no_grad():
                merged.get_submodule(path).weight += scale * b @ a
    prompts = [_prompt(tokenizer, q) for q in QUESTIONS[:2]]
    with Engine(model, tokenizer, max_batch_size=4, max_seq_len=256) as engine:
        await engine.load_weights(state, version=1)
        assert engine.adapter_names == ["tuned"]
        params = SamplingParams(temperature=0.0, max_tokens=12)
        outs = await asyncio.gather(
            *(engine.generate(p, params, adapter=name) for p in prompts for name in ("tuned", None))
        )
    for i, prompt in enumerate(prompts):
        tuned, base = outs[2 * i].token_ids, outs[2 * i + 1].token_ids
        assert tuned == _hf_greedy(merged, prompt, 12), f"adapter, request {i}"
        assert base == _hf_greedy(model, prompt, 12), f"base, request {i}"
        assert tuned != base  # the adapter changes what is generated
