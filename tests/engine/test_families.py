"""Every family on the fast path computes what transformers computes: random-init small Llama, Qwen2,
Qwen3 and Gemma 3 models (Gemma 3 with local layers of a 16-token window alternating with global ones,
its own query scale and a logit soft-cap; Qwen3 with a sliding layer too), prompts longer than the
window, logits within 1e-4 of the HF forward at every step, greedy outputs identical to HF generate,
and the shared-prefix (cascade) decode exact too."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GPT2Config,
    GPT2LMHeadModel,
    PreTrainedTokenizerFast,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from reinforge.engine import Engine
from reinforge.engine.architectures import describe
from reinforge.engine.errors import UnsupportedArchitectureError
from reinforge.engine.model_runner import SlotCacheRunner
from reinforge.inference.contract import SamplingParams

from .conftest import diversify, hf_greedy, prompts

WINDOW = 16


def _jitter_norms(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Norm weights away from their init (Gemma's are zeros, i.e. scale 1), so a wrong `1 + w` shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)
    return model


def _build(model_class: type[torch.nn.Module], config: object, seed: int) -> torch.nn.Module:
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = model_class(config).eval()  # type: ignore[call-arg]
    return _jitter_norms(diversify(model, seed=seed), seed)


@pytest.fixture(scope="module")
def qwen3(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        use_sliding_window=True,
        sliding_window=WINDOW,
        max_window_layers=1,  # layer 0 global, layer 1 sliding
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
    )
    return _build(Qwen3ForCausalLM, config, seed=11)


@pytest.fixture(scope="module")
def gemma3(tokenizer: PreTrainedTokenizerFast) -> torch.nn.Module:
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
        query_pre_attn_scalar=24,
        final_logit_softcapping=30.0,
        max_position_embeddings=512,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )
    return _build(Gemma3ForCausalLM, config, seed=12)


FAMILIES = ["llama", "qwen", "qwen3", "gemma3"]


def test_the_families_are_described_as_they_are(qwen3: torch.nn.Module, gemma3: torch.nn.Module) -> None:
    q = describe(qwen3)
    assert (q.family, q.qk_norm, q.norm_offset, q.sandwich_norms, q.windows) == (
        "qwen3",
        True,
        0.0,
        False,
        (None, 16),
    )
    g = describe(gemma3)
    assert (g.family, g.qk_norm, g.norm_offset, g.sandwich_norms) == ("gemma3_text", True, 1.0, True)
    assert g.windows == (16, None, 16, None)
    assert g.rope_kinds == ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
    assert (g.embed_scale, g.attn_scale, g.final_softcap) == (
        pytest.approx(8.0),
        pytest.approx(24**-0.5),
        30.0,
    )


def _hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()  # type: ignore[operator]


@pytest.mark.parametrize("arch", FAMILIES)
def test_cpu_logits_equal_the_hf_forward_past_the_window(
    arch: str, request: pytest.FixtureRequest, tokenizer: PreTrainedTokenizerFast
) -> None:
    """Prefill three prompts (one shorter than the window, two longer), then decode 24 steps feeding
    HF's greedy choice: the logits of every step equal HF's full forward of the same sequence."""
    model = request.getfixturevalue(arch)
    runner = SlotCacheRunner(model, max_slots=4, max_seq_len=128)
    short, *longer = prompts(tokenizer, 3)
    batch = [short[:10], *(p * 3 for p in longer)]  # 10 to ~80 tokens: the window is 16
    assert min(len(p) for p in batch) < WINDOW < max(len(p) for p in batch)
    logits = runner.prefill(0, batch)
    seqs = [list(p) for p in batch]
    for step in range(24):
        for i, seq in enumerate(seqs):
            expected = _hf_logits(model, seq)[-1]
            assert torch.allclose(logits[i], expected, atol=1e-4, rtol=0), f"{arch} row {i} step {step}"
        tokens = [int(row.argmax()) for row in logits]
        logits = runner.decode(tokens, [len(s) for s in seqs])
        for seq, token in zip(seqs, tokens, strict=True):
            seq.append(token)


@pytest.mark.parametrize("arch", FAMILIES)
def test_cpu_cascade_decode_over_a_shared_prefix_equals_the_hf_forward(
    arch: str, request: pytest.FixtureRequest, tokenizer: PreTrainedTokenizerFast
) -> None:
    """Four sequences sharing a 90-token prefix (copied, as the engine's prefix reuse does): decode
    reads the prefix once for all rows, and every step still equals HF, windows included."""
    model = request.getfixturevalue(arch)
    runner = SlotCacheRunner(model, max_slots=4, max_seq_len=160)
    prefix = [t for p in prompts(tokenizer, 6) for t in p][:90]
    suffixes = [p[1:] for p in prompts(tokenizer, 4)]
    batch = [prefix + s for s in suffixes]
    runner.prefill(0, [batch[0]])
    runner.move_many([(0, slot, len(prefix)) for slot in (1, 2, 3)])
    first = runner.prefill(1, batch[1:], cached=[len(prefix)] * 3)
    logits = torch.cat([_hf_logits(model, batch[0])[-1:], first])
    seqs = [list(p) for p in batch]
    for step in range(12):
        tokens = [int(row.argmax()) for row in logits]
        logits = runner.decode(tokens, [len(s) for s in seqs])
        for i, (seq, token) in enumerate(zip(seqs, tokens, strict=True)):
            seq.append(token)
            expected = _hf_logits(model, seq)[-1]
            assert torch.allclose(logits[i], expected, atol=1e-4, rtol=0), f"{arch} row {i} step {step}"
    assert runner._shared is not None and runner._shared >= len(prefix)  # the cascade path ran


@pytest.mark.parametrize("arch", ["qwen3", "gemma3"])
async def test_cpu_greedy_equals_hf_generate_with_continuous_batching(
    arch: str,
    request: pytest.FixtureRequest,
    tokenizer: PreTrainedTokenizerFast,
    make_engine: Callable[..., Engine],
) -> None:
    model = request.getfixturevalue(arch)
    engine = make_engine(model, tokenizer, max_batch_size=3, max_seq_len=256)
    assert engine.uses_fast_path
    batch = [p * 2 for p in prompts(tokenizer, 8)]  # more requests than slots: they join as others end

    async def one(i: int) -> list[int]:
        await asyncio.sleep(0.002 * i)
        out = await engine.generate(batch[i], SamplingParams(temperature=0.0, max_tokens=8 + 2 * i))
        return out.token_ids

    got = await asyncio.gather(*(one(i) for i in range(len(batch))))
    for i, p in enumerate(batch):
        assert got[i] == hf_greedy(model, p, 8 + 2 * i, tokenizer.eos_token_id), f"{arch} prompt {i}"


def test_an_unsupported_family_is_refused_by_name(
    tokenizer: PreTrainedTokenizerFast, make_engine: Callable[..., Engine]
) -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=2)).eval()
    with pytest.raises(
        UnsupportedArchitectureError, match="model type 'gpt2' is not on the engine's fast path"
    ):
        describe(gpt2)
    assert not make_engine(gpt2, tokenizer).uses_fast_path  # served, exactly and slowly, by recompute
    capped = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        attn_logit_softcapping=50.0,
    )
    with pytest.raises(
        UnsupportedArchitectureError, match=r"attention logit soft-capping \(attn_logit_softcapping=50.0\)"
    ):
        describe(Gemma3ForCausalLM(capped))
    broken = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    del broken.model.layers[0].self_attn.k_norm
    with pytest.raises(UnsupportedArchitectureError, match=r"qwen3 layer 0 lacks self_attn\.k_norm"):
        describe(broken)
