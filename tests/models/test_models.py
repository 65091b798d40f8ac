"""The tokenizer factory and the tiny model builders, on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from reinforge.errors import InvalidRequestError
from reinforge.models import build_tokenizer, tiny_llama, tiny_qwen2

torch.set_num_threads(1)

CORPUS = [
    f"What is {a}+{b}*{c}? <calc>{b}*{c}</calc><res>{b * c}</res> ANSWER: {a + b * c}"
    for a in range(20)
    for b in range(10)
    for c in range(5)
]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calc",
            "description": "evaluate a op b",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]
CONVERSATION = [
    {"role": "system", "content": "You are a calculator."},
    {"role": "user", "content": "37+58*2=?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "calc", "arguments": '{"expression":"58*2"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "116"},
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return build_tokenizer(CORPUS, vocab_size=320, special_tokens=["<calc>", "</calc>", "<res>", "</res>"])


def test_digits_are_single_tokens(tokenizer: PreTrainedTokenizerFast) -> None:
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("12345 + 678")["input_ids"])
    digits = [t for t in tokens if any(ch.isdigit() for ch in t)]
    assert digits == ["1", "2", "3", "4", "5", "6", "7", "8"]


def test_markers_are_single_tokens_and_survive_decoding(tokenizer: PreTrainedTokenizerFast) -> None:
    ids = tokenizer("<calc>12</calc><tool_call>{}</tool_call></s>")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids) == [
        "<calc>",
        "1",
        "2",
        "</calc>",
        "<tool_call>",
        "{",
        "}",
        "</tool_call>",
        "</s>",
    ]
    # Control tokens are dropped by skip_special_tokens, the task's and tool markers stay.
    assert tokenizer.decode(ids, skip_special_tokens=True) == "<calc>12</calc><tool_call>{}</tool_call>"


def test_spaces_apart_spells_a_word_alike_after_a_space_a_bracket_and_a_dot() -> None:
    corpus = [
        f"SELECT AVG({w}) FROM t WHERE T1.{w} > 3 AND {w} < 9" for w in ("height", "weight", "eight")
    ] * 20
    apart = build_tokenizer(corpus, vocab_size=300, spaces_apart=True)
    joined = build_tokenizer(corpus, vocab_size=300)

    def pieces(tok: PreTrainedTokenizerFast, text: str) -> list[str]:
        return [
            t for t in tok.convert_ids_to_tokens(tok(text)["input_ids"]) if t not in ("(", ".", "Ġ", "T", "1")
        ]

    assert pieces(apart, " height") == pieces(apart, "(height") == pieces(apart, "T1.height")
    assert apart.convert_ids_to_tokens(apart(" height ")["input_ids"])[0] == "Ġ"
    assert all("Ġ" not in t or t == "Ġ" for t in apart.convert_ids_to_tokens(apart(corpus[0])["input_ids"]))
    text = "SELECT AVG(height)  FROM t"
    assert apart.decode(apart(text)["input_ids"]) == text  # lossless, double space included
    # the default merges a space into the word after it, so the two spellings differ
    assert pieces(joined, " height") != pieces(joined, "(height")


def test_special_token_ids(tokenizer: PreTrainedTokenizerFast) -> None:
    assert (tokenizer.bos_token, tokenizer.eos_token, tokenizer.pad_token) == ("<s>", "</s>", "<pad>")
    assert len({tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}) == 3
    # BPE vocabulary (at most vocab_size; a small corpus runs out of merges) + tool and task markers.
    assert tokenizer.vocab_size <= 320
    assert len(tokenizer) == tokenizer.vocab_size + 6


def test_chat_template_renders_the_documented_format(tokenizer: PreTrainedTokenizerFast) -> None:
    text = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert text == (
        "<s><|system|>You are a calculator.\ncalc(expression): evaluate a op b</s>"
        "<|user|>37+58*2=?</s>"
        '<|assistant|><tool_call>{"name":"calc","arguments":{"expression":"58*2"}}</tool_call></s>'
        "<|tool|>116</s><|assistant|>"
    )


def test_chat_template_variants(tokenizer: PreTrainedTokenizerFast) -> None:
    # Tools without a system message open one; content parts are joined; dict arguments become JSON.
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {
            "role": "assistant",
            "content": "ok",
            "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}],
        },
    ]
    text = tokenizer.apply_chat_template(messages, tools=TOOLS, tokenize=False)
    assert text == (
        "<s><|system|>calc(expression): evaluate a op b</s><|user|>ab</s>"
        '<|assistant|>ok<tool_call>{"name":"f","arguments":{"x":1}}</tool_call></s>'
    )
    no_tools = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert no_tools == "<s><|user|>hi</s>"


def test_chat_is_compact(tokenizer: PreTrainedTokenizerFast) -> None:
    text = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    # Each role marker and each tool marker is exactly one token.
    for marker in ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<tool_call>", "</tool_call>"):
        assert tokenizer.convert_tokens_to_ids(marker) in ids
    assert len(ids) < len(text) // 1.5


def test_save_and_load_round_trip(tokenizer: PreTrainedTokenizerFast, tmp_path: Path) -> None:
    model = tiny_llama(tokenizer)
    tokenizer.save_pretrained(tmp_path)
    model.save_pretrained(tmp_path)
    loaded_tok = AutoTokenizer.from_pretrained(tmp_path)
    loaded_model = AutoModelForCausalLM.from_pretrained(tmp_path)
    text = tokenizer.apply_chat_template(
        CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert (
        loaded_tok.apply_chat_template(CONVERSATION, tools=TOOLS, tokenize=False, add_generation_prompt=True)
        == text
    )
    assert loaded_tok(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert (loaded_tok.eos_token_id, loaded_tok.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    ids = torch.tensor([tokenizer(text)["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded_model(ids).logits)
    assert json.loads((tmp_path / "config.json").read_text())["vocab_size"] == len(tokenizer)


def test_tiny_models_are_seeded_and_sized(tokenizer: PreTrainedTokenizerFast) -> None:
    state = torch.random.get_rng_state()
    a, b = tiny_llama(tokenizer, seed=3), tiny_llama(tokenizer, seed=3)
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched
    assert all(
        torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values(), strict=True)
    )
    assert 0.9e6 < sum(p.numel() for p in a.parameters()) < 1.3e6
    big = tiny_llama(tokenizer, hidden_size=256, num_layers=6, intermediate_size=1024)
    assert 5.5e6 < sum(p.numel() for p in big.parameters()) < 7e6
    qwen = tiny_qwen2(tokenizer)
    assert qwen.config.model_type == "qwen2"
    assert qwen.model.layers[0].self_attn.q_proj.bias is not None
    assert qwen.config.eos_token_id == tokenizer.eos_token_id


def test_bad_sizes_are_rejected(tokenizer: PreTrainedTokenizerFast) -> None:
    with pytest.raises(InvalidRequestError, match="divisible"):
        tiny_llama(tokenizer, hidden_size=100, num_heads=3)
    with pytest.raises(InvalidRequestError, match="too small"):
        build_tokenizer(["abc"], vocab_size=100)
