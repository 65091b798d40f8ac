"""EngineBackend: chat template with tools, tool-call parsing, streaming, the Backend protocol."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import torch
from transformers import PreTrainedTokenizerFast

from inference.test_chat_render import conversation
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import (
    Backend,
    GenerationRequest,
    GenerationResult,
    PreparesAhead,
    SamplingParams,
    TextDelta,
)
from reinforge.inference.tool_calls import parse_tool_calls, safe_prefix_len
from reinforge.models import build_tokenizer, tiny_llama

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
CALL = '<tool_call>{"name":"calc","arguments":{"expression":"2+3"}}</tool_call>'
# What the memorised model answers to each user message (with TOOLS in the prompt).
SCRIPT = {
    "add 2 and 3": CALL,
    "say hi": "Hi there",
    "break it": '<tool_call>{"name":"calc","arguments":{oops}</tool_call>',
    "two calls": "ok " + CALL + CALL,
}


def test_parse_tool_calls_rules() -> None:
    parsed = parse_tool_calls("I will compute. " + CALL)
    assert (parsed.text, parsed.malformed) == ("I will compute.", False)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("calc", {"expression": "2+3"})]
    assert parsed.tool_calls[0].id.startswith("call_")
    # Arguments given as a JSON string (OpenAI's shape) are accepted too.
    as_string = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>')
    assert json.loads(as_string.tool_calls[0].arguments) == {"x": 1}
    for bad in (
        "<tool_call>not json</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>',
        '<tool_call>{"name": "f", "arguments": {}}',  # left open (e.g. cut by max_tokens)
        CALL + "<tool_call>",
    ):
        result = parse_tool_calls(bad)
        assert (result.malformed, result.tool_calls, result.text) == (True, [], bad)
    assert parse_tool_calls("plain").text == "plain"


def test_safe_prefix_len_holds_back_markup() -> None:
    assert safe_prefix_len("hello") == 5
    assert safe_prefix_len("hello <tool") == 5
    assert safe_prefix_len("hello ") == 5
    assert safe_prefix_len("hi <tool_call>{") == 2


@pytest.fixture(scope="module")
def memorised() -> tuple[torch.nn.Module, PreTrainedTokenizerFast]:
    """A tiny model trained for a second to answer SCRIPT exactly (greedy), tool calls included."""
    torch.set_num_threads(1)
    corpus = [*SCRIPT.keys(), *SCRIPT.values(), "evaluate a op b expression"] * 5
    tokenizer = build_tokenizer(corpus, vocab_size=300)
    model = tiny_llama(tokenizer, hidden_size=64, num_layers=2, intermediate_size=128, seed=0)
    rows = []
    for user, answer in SCRIPT.items():
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], tools=TOOLS, tokenize=False, add_generation_prompt=True
        )
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tokenizer(answer + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        rows.append((p_ids, a_ids))
    width = max(len(p) + len(a) for p, a in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    labels = torch.full((len(rows), width), -100)
    for i, (p, a) in enumerate(rows):
        ids[i, : len(p) + len(a)] = torch.tensor(p + a)
        labels[i, len(p) : len(p) + len(a)] = torch.tensor(a)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(300):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        if loss.item() < 0.01:
            break
    model.eval()
    return model, tokenizer


@pytest.fixture
def backend(
    memorised: tuple[torch.nn.Module, PreTrainedTokenizerFast], make_engine: Callable[..., Engine]
) -> EngineBackend:
    model, tokenizer = memorised
    return EngineBackend(make_engine(model, tokenizer), tokenizer, model_name="tiny")


def chat(user: str, **kwargs: object) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": user}],
        tools=kwargs.pop("tools", TOOLS),  # type: ignore[arg-type]
        sampling=SamplingParams(temperature=0, max_tokens=60),
        **kwargs,  # type: ignore[arg-type]
    )


async def test_cpu_backend_returns_tool_calls(backend: EngineBackend) -> None:
    assert isinstance(backend, Backend)
    result = await backend.generate(chat("add 2 and 3"))
    assert result.finish_reason == "tool_calls"
    assert result.text == ""
    assert [(c.name, json.loads(c.arguments)) for c in result.tool_calls] == [("calc", {"expression": "2+3"})]
    assert not result.malformed_tool_call
    tok = backend.tokenizer
    assert result.completion_token_ids[-1] == tok.eos_token_id
    assert tok.decode(result.completion_token_ids, skip_special_tokens=True) == CALL
    assert len(result.logprobs) == len(result.completion_token_ids)
    expected_prompt = tok.apply_chat_template(
        [{"role": "user", "content": "add 2 and 3"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert result.prompt_token_ids == tok(expected_prompt, add_special_tokens=False)["input_ids"]

    two = await backend.generate(chat("two calls"))
    assert (two.text, len(two.tool_calls), two.finish_reason) == ("ok", 2, "tool_calls")
    assert len({c.id for c in two.tool_calls}) == 2


async def test_cpu_backend_flags_malformed_calls_and_plain_text(backend: EngineBackend) -> None:
    bad = await backend.generate(chat("break it"))
    assert bad.malformed_tool_call
    assert bad.tool_calls == []
    assert bad.text == SCRIPT["break it"]
    assert bad.finish_reason == "stop"
    plain = await backend.generate(chat("say hi"))
    assert (plain.text, plain.finish_reason, plain.malformed_tool_call) == ("Hi there", "stop", False)
    # tool_choice "none": tools are not offered, nothing is parsed.
    none = await backend.generate(chat("add 2 and 3", tool_choice="none"))
    assert none.tool_calls == []


async def test_cpu_backend_stream_holds_back_tool_markup(backend: EngineBackend) -> None:
    items = [i async for i in backend.stream(chat("two calls"))]
    result = items[-1]
    assert isinstance(result, GenerationResult)
    deltas = [i.text for i in items[:-1] if isinstance(i, TextDelta)]
    assert len(deltas) == len(items) - 1
    assert "".join(deltas) == result.text == "ok"
    assert len(result.tool_calls) == 2
    plain = [i async for i in backend.stream(chat("say hi"))]
    assert "".join(i.text for i in plain if isinstance(i, TextDelta)) == "Hi there"


async def test_cpu_backend_completions_and_bad_requests(backend: EngineBackend) -> None:
    tok = backend.tokenizer
    text = await backend.generate(
        GenerationRequest(prompt="say", sampling=SamplingParams(max_tokens=5, seed=1))
    )
    assert text.prompt_token_ids == tok("say")["input_ids"]
    ids = await backend.generate(
        GenerationRequest(prompt=[1, 2, 3], sampling=SamplingParams(max_tokens=5, seed=1))
    )
    assert ids.prompt_token_ids == [1, 2, 3]
    with pytest.raises(InvalidRequestError, match="has no tools"):
        await backend.generate(chat("add 2 and 3", tools=None, tool_choice="required"))
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        await backend.generate(chat("add 2 and 3", tool_choice="sometimes"))
    with pytest.raises(InvalidRequestError, match="role"):
        await backend.generate(GenerationRequest(messages=[{"content": "x"}]))
    with pytest.raises(InvalidRequestError, match="messages or a prompt"):
        await backend.generate(GenerationRequest())


def _count_renders(backend: EngineBackend) -> list[int]:
    """A list that grows by one each time the backend renders a prompt (not from its cache)."""
    calls: list[int] = []
    render = backend._renderer.render

    def counted(
        messages: list[dict[str, object]],
        tools: list[dict[str, object]] | None = None,
        generated: dict[int, list[int]] | None = None,
    ) -> list[int]:
        calls.append(1)
        return render(messages, tools, generated)

    backend._renderer.render = counted  # type: ignore[method-assign]
    return calls


async def test_repeated_messages_reuse_the_rendered_prompt(backend: EngineBackend) -> None:
    """A group's rollouts send the same messages: rendered once, the same ids every time; a change
    in the messages or the tools renders again."""
    tok = backend.tokenizer
    calls = _count_renders(backend)
    first = await backend.generate(chat("add 2 and 3"))
    again = await backend.generate(chat("add 2 and 3"))
    other = await backend.generate(chat("say hi"))
    no_tools = await backend.generate(chat("add 2 and 3", tool_choice="none"))
    assert len(calls) == 3
    assert first.prompt_token_ids == again.prompt_token_ids
    assert again.prompt_token_ids != other.prompt_token_ids != no_tools.prompt_token_ids
    expected = tok.apply_chat_template(
        [{"role": "user", "content": "say hi"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert other.prompt_token_ids == tok(expected, add_special_tokens=False)["input_ids"]
    # The cached ids are handed out as a fresh list: a caller changing them changes nothing here.
    again.prompt_token_ids.append(0)
    assert (await backend.generate(chat("add 2 and 3"))).prompt_token_ids == first.prompt_token_ids


async def test_a_generated_turn_goes_into_the_prompt_as_its_ids(backend: EngineBackend) -> None:
    """A tool call the model wrote with spaces the template leaves out: the next prompt keeps the
    ids it generated (`inference.chat_render`), so the two calls merge."""
    tok = backend.tokenizer
    first = await backend.generate(chat("add 2 and 3"))
    spaced = CALL.replace('{"name":"calc","arguments":', '{"name": "calc", "arguments": ')
    history, generated = conversation(tok, spaced, "5", user={"role": "user", "content": "add 2 and 3"})
    request = GenerationRequest(
        messages=history, tools=TOOLS, sampling=SamplingParams(temperature=0, max_tokens=4)
    )
    as_sent = await backend.generate(request)
    kept = await backend.generate(request.model_copy(update={"generated_turns": {1: generated}}))
    head = first.prompt_token_ids + generated
    assert as_sent.prompt_token_ids[: len(head)] != head
    assert kept.prompt_token_ids[: len(head)] == head


async def test_a_prompt_prepared_ahead_is_not_rendered_again(backend: EngineBackend) -> None:
    """`prepare_ahead` (a held call, while it waits) renders the prompt that generate then finds
    rendered; a request it can't render is left for generate to refuse, as without it."""
    calls = _count_renders(backend)
    backend.prepare_ahead(chat("say hi"))
    backend.prepare_ahead(chat("say hi", tool_choice="none"))
    assert len(calls) == 2
    ahead = await backend.generate(chat("say hi"))
    plain = await backend.generate(chat("say hi", tool_choice="none"))
    assert len(calls) == 2
    tok = backend.tokenizer
    expected = tok.apply_chat_template(
        [{"role": "user", "content": "say hi"}], tools=TOOLS, tokenize=False, add_generation_prompt=True
    )
    assert ahead.prompt_token_ids == tok(expected, add_special_tokens=False)["input_ids"]
    assert plain.prompt_token_ids != ahead.prompt_token_ids
    bad = GenerationRequest(messages=[{"content": "no role"}])
    backend.prepare_ahead(bad)  # raises nothing
    backend.prepare_ahead(GenerationRequest(prompt="plain text"))  # nothing to render ahead
    with pytest.raises(InvalidRequestError, match="role"):
        await backend.generate(bad)
    assert isinstance(backend, PreparesAhead)


async def test_a_model_without_a_chat_template_refuses_chat_by_name(
    make_engine: Callable[..., Engine],
) -> None:
    """A base model (Gemma 3 270M's GGUF ships none) serves prompts; chat messages get a clear error."""
    tokenizer = build_tokenizer(["what is two plus three"] * 20, vocab_size=300)
    tokenizer.chat_template = None
    backend = EngineBackend(
        make_engine(tiny_llama(tokenizer, hidden_size=32, num_layers=1), tokenizer), tokenizer
    )
    with pytest.raises(InvalidRequestError, match=r"tokenizer has no chat template .*send a prompt"):
        await backend.generate(chat("say hi"))
    out = await backend.generate(GenerationRequest(prompt="what is", sampling=SamplingParams(max_tokens=3)))
    assert out.prompt_token_ids == tokenizer("what is")["input_ids"] and len(out.completion_token_ids) >= 1
