from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from reinforge.algorithms import compute_token_logprobs

torch.set_num_threads(1)


class FixedLogits(nn.Module):
    """Logits [0, 0, ln 2, ln 4] at every position: probabilities 1/8, 1/8, 2/8, 4/8."""

    def forward(self, input_ids: torch.Tensor, **_: Any) -> SimpleNamespace:
        row = torch.tensor([0.0, 0.0, math.log(2), math.log(4)])
        return SimpleNamespace(logits=row.expand(*input_ids.shape, 4).clone(), hidden_states=None)


def test_logprobs_and_entropy_by_hand() -> None:
    ids = torch.tensor([[0, 3, 2, 1]])
    mask = torch.tensor([[0, 1, 1, 0]])
    out = compute_token_logprobs(FixedLogits(), ids, torch.ones_like(ids), mask, with_entropy=True)
    assert out.logprobs[0].tolist() == pytest.approx([0.0, math.log(0.5), math.log(0.25), 0.0])
    # H = -(2 · 1/8 · ln 1/8 + 1/4 · ln 1/4 + 1/2 · ln 1/2) = 1.75 ln 2
    assert out.entropy is not None
    assert out.entropy[0].tolist() == pytest.approx([0.0, 1.75 * math.log(2), 1.75 * math.log(2), 0.0])


def test_temperature_flattens_the_distribution() -> None:
    ids, mask = torch.tensor([[0, 3]]), torch.tensor([[0, 1]])
    out = compute_token_logprobs(FixedLogits(), ids, torch.ones_like(ids), mask, temperature=2.0)
    # logits / 2 → weights 1, 1, √2, 2: p(3) = 2 / (4 + √2)
    assert out.logprobs[0, 1].item() == pytest.approx(math.log(2 / (4 + math.sqrt(2))))


def test_bad_inputs_are_refused() -> None:
    ids = torch.tensor([[0, 3]])
    with pytest.raises(ValueError, match="temperature must be > 0"):
        compute_token_logprobs(
            FixedLogits(), ids, torch.ones_like(ids), torch.tensor([[0, 1]]), temperature=0
        )
    with pytest.raises(ValueError, match="first position"):
        compute_token_logprobs(FixedLogits(), ids, torch.ones_like(ids), torch.tensor([[1, 1]]))


def tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=40,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


def test_padded_batches_match_each_sequence_alone() -> None:
    model = tiny_llama()
    seqs = [[1, 5, 6, 7, 8, 9], [1, 11, 12, 13]]
    prompt_len = [2, 3]
    reference = []
    for seq, p in zip(seqs, prompt_len, strict=True):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([seq])).logits[0].float()
        full = torch.log_softmax(logits, dim=-1)
        reference.append([full[i - 1, seq[i]].item() for i in range(p, len(seq))])

    for left in (False, True):
        width = max(map(len, seqs))
        ids = torch.zeros(2, width, dtype=torch.long)
        attn = torch.zeros(2, width, dtype=torch.long)
        resp = torch.zeros(2, width, dtype=torch.long)
        for r, (seq, p) in enumerate(zip(seqs, prompt_len, strict=True)):
            start = width - len(seq) if left else 0
            ids[r, start : start + len(seq)] = torch.tensor(seq)
            attn[r, start : start + len(seq)] = 1
            resp[r, start + p : start + len(seq)] = 1
        with torch.no_grad():
            out = compute_token_logprobs(model, ids, attn, resp, with_hidden_states=True)
        assert out.logprobs.dtype == torch.float32
        for r in range(2):
            got = out.logprobs[r][resp[r].bool()].tolist()
            assert got == pytest.approx(reference[r], abs=1e-5), f"left padding={left}"
        assert out.hidden_states is not None and out.hidden_states.shape == (2, width, 32)
