"""Penalties, logit bias and grammars: they change what is sampled, and so the behaviour logprob
recorded (the distribution actually sampled from), never the policy the trainer recomputes."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import torch

from reinforge.demo.calculator import CALCULATOR_TOOL
from reinforge.demo.warm_start import load_warm_start
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.engine.logit_shaping import LogitShaper, token_bytes
from reinforge.errors import InvalidRequestError
from reinforge.inference.contract import GenerationRequest, ResponseFormat, SamplingParams

LOOKUP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up",
        "parameters": {
            "type": "object",
            "properties": {"word": {"type": "string", "maxLength": 8}},
            "required": ["word"],
        },
    },
}


@pytest.fixture(scope="module")
def warm() -> tuple[Any, Any]:
    return load_warm_start()


@pytest.fixture
async def backend(warm: tuple[Any, Any]) -> AsyncIterator[EngineBackend]:
    model, tokenizer = warm
    engine = Engine(model, tokenizer, max_batch_size=8, seed=0)
    yield EngineBackend(engine)
    engine.stop()


def question(text: str, **kwargs: Any) -> GenerationRequest:
    sampling = kwargs.pop("sampling", SamplingParams(temperature=1.0, max_tokens=64, seed=3))
    return GenerationRequest(messages=[{"role": "user", "content": text}], sampling=sampling, **kwargs)


def policy_logprobs(model: Any, prompt: list[int], completion: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]


def assert_constrained(recorded: list[float], policy: list[float]) -> None:
    """A grammar removes tokens and renormalises what is left: every recorded logprob is at least
    the policy's, and the tokens the grammar forced (a brace, a quote) are recorded as certain."""
    assert all(r >= p - 1e-4 for r, p in zip(recorded, policy, strict=True))
    forced = [i for i, r in enumerate(recorded) if r == pytest.approx(0.0, abs=1e-6)]
    assert any(policy[i] < -1e-3 for i in forced), (recorded, policy)


def test_token_bytes_spell_every_token_as_the_tokenizer_decodes_it(warm: tuple[Any, Any]) -> None:
    _, tokenizer = warm
    pieces, special = token_bytes(tokenizer)
    assert set(special) == {i for i, t in tokenizer.added_tokens_decoder.items() if t.special}
    assert {0, 1, 2} <= set(special) and 320 not in special  # <tool_call> is text, not a marker
    text = '<tool_call>{"name":"calculator","arguments":{"expression":"12*3"}}</tool_call> ok'
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert b"".join(pieces[i] for i in ids).decode() == text


async def test_required_tool_choice_forces_a_call_to_one_of_the_tools(
    backend: EngineBackend, warm: tuple[Any, Any]
) -> None:
    """A question the model answers in text unconstrained still gets a well-formed call."""
    request = question("Say hello.", tools=[CALCULATOR_TOOL], tool_choice="required")
    for seed in range(3):
        sampling = SamplingParams(temperature=1.0, max_tokens=64, seed=seed)
        result = await backend.generate(request.model_copy(update={"sampling": sampling}))
        assert result.finish_reason == "tool_calls", result
        assert [c.name for c in result.tool_calls] == ["calculator"]
        assert isinstance(json.loads(result.tool_calls[0].arguments)["expression"], str)
        model, _ = warm
        expected = policy_logprobs(model, result.prompt_token_ids, result.completion_token_ids)
        assert_constrained(result.logprobs, expected)


async def test_a_named_tool_choice_calls_that_tool(backend: EngineBackend) -> None:
    request = question(
        "What is 3+4?",
        tools=[CALCULATOR_TOOL, LOOKUP_TOOL],
        tool_choice={"type": "function", "function": {"name": "lookup"}},
        parallel_tool_calls=False,
    )
    result = await backend.generate(request)
    assert [c.name for c in result.tool_calls] == ["lookup"], result
    arguments = json.loads(result.tool_calls[0].arguments)
    assert list(arguments) == ["word"] and len(arguments["word"]) <= 8
    with pytest.raises(InvalidRequestError, match="not among the tools"):
        await backend.generate(
            question(
                "x", tools=[CALCULATOR_TOOL], tool_choice={"type": "function", "function": {"name": "no"}}
            )
        )
    with pytest.raises(InvalidRequestError, match="no tools"):
        await backend.generate(question("x", tool_choice="required"))


async def test_json_schema_output_parses_and_matches_the_schema(
    backend: EngineBackend, warm: tuple[Any, Any]
) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 6}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    fmt = ResponseFormat(type="json_schema", json_schema=schema, name="Answer")
    result = await backend.generate(question("What is 3+4?", response_format=fmt))
    assert result.finish_reason == "stop", result
    value = json.loads(result.text)
    assert set(value) == {"answer", "sure"}
    assert len(value["answer"]) <= 6 and isinstance(value["sure"], bool)
    assert result.finish_reason == "stop"
    model, _ = warm
    expected = policy_logprobs(model, result.prompt_token_ids, result.completion_token_ids)
    assert_constrained(result.logprobs, expected)
    any_object = await backend.generate(
        question("What is 3+4?", response_format=ResponseFormat(type="json_object"))
    )
    assert isinstance(json.loads(any_object.text), dict)


async def test_logit_bias_moves_the_greedy_choice(backend: EngineBackend) -> None:
    greedy = SamplingParams(temperature=0.0, max_tokens=3)
    plain = await backend.generate(question("What is 3+4?", sampling=greedy))
    first = plain.completion_token_ids[0]
    banned = await backend.generate(
        question("What is 3+4?", sampling=greedy.model_copy(update={"logit_bias": {first: -100.0}}))
    )
    assert banned.completion_token_ids[0] != first
    forced = await backend.generate(
        question("What is 3+4?", sampling=greedy.model_copy(update={"logit_bias": {42: 100.0}}))
    )
    assert forced.completion_token_ids[0] == 42
    # Greedy records the shaped logits at temperature 1: the bias made token 42 all but certain.
    assert forced.logprobs[0] > -1e-3
    assert plain.logprobs[0] < 0.0


def test_penalties_follow_openais_definition() -> None:
    shaper = LogitShaper(
        SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, logit_bias={3: 2.0}), None
    )
    for token in (1, 1, 2):
        assert shaper.advance(token) is False
    logits = torch.zeros(5)
    shaper.shape(logits)
    assert logits.tolist() == pytest.approx([0.0, -(0.5 + 2 * 0.25), -(0.5 + 0.25), 2.0, 0.0])


def test_bad_bias_and_bad_grammar_are_refused(warm: tuple[Any, Any]) -> None:
    with pytest.raises(ValueError, match="lie in"):
        SamplingParams(logit_bias={1: 500.0})
    model, tokenizer = warm
    engine = Engine(model, tokenizer, max_batch_size=2)
    try:
        with pytest.raises(InvalidRequestError, match="output constraint"):
            LogitShaper(SamplingParams(grammar="start: %json {not json"), engine._grammars)
    finally:
        engine.stop()
