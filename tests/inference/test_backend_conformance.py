"""One conformance suite for the inference Backend contract (inference/contract.py), run on every backend.

The `subject` fixture serves the same tests on ScriptedBackend, EngineBackend (a tiny model memorised
to answer a script exactly, built by tests/engine/test_engine_backend.py) and UpstreamBackend replaying
vLLM and SGLang recordings (tests/fixtures/upstream, served by test_upstream's fake server). Each
subject states, per scenario, the request to send and the values its result must carry; a scenario a
backend cannot show is skipped with a reason that says why.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, get_args

import pytest

from engine.test_engine_backend import SCRIPT, TOOLS, memorised  # noqa: F401  (fixture reused)
from reinforge.engine import Engine
from reinforge.engine.engine_backend import EngineBackend
from reinforge.inference import (
    Backend,
    FinishReason,
    GenerationRequest,
    GenerationResult,
    SamplingParams,
    ScriptedBackend,
    ScriptedReply,
    ScriptedToolCall,
    TextDelta,
    UpstreamBackend,
)

from .test_upstream import FakeUpstream, fixture, upstream  # noqa: F401  (fixture reused)

SCENARIOS = ("plain", "tool_call", "malformed", "length", "stop", "stream_tool")
QWEN = "Qwen/Qwen2.5-1.5B-Instruct"
EXACT_ARGUMENTS = '{"expression":"2+3"}'
"""Compact on purpose: the contract keeps the argument text as written, never re-serialised."""
BROKEN_MARKUP = '<tool_call>{"name": "broken", "arguments": {</tool_call>'
"""What ScriptedBackend writes for a malformed call (`ScriptedReply(malformed=True)`)."""
LENGTH_LIMIT = 2


@dataclass(frozen=True)
class Case:
    """One request and the values its result must carry."""

    request: GenerationRequest
    text: str
    finish_reason: FinishReason
    prompt_ids: list[int]
    tool_calls: list[tuple[str, str]] = field(default_factory=list)
    """(name, exact argument text) of each call, in order."""
    malformed: bool = False
    completion_ids: list[int] | None = None
    """The exact ids where they are known beforehand (a recording); else checked by decoding."""
    recording: str | None = None
    """The SGLang recording the fake upstream replays for this case."""


@dataclass
class Subject:
    name: str
    backend: Backend
    model_name: str
    policy_version: int
    cases: dict[str, Case | str]
    """A Case per scenario, or the reason the backend cannot show it."""
    decode: Callable[[list[int]], str] | None = None
    """Decodes completion ids without special tokens; None where the ids are a remote model's."""
    select: Callable[[Case], None] = lambda case: None

    def case(self, scenario: str) -> Case:
        case = self.cases[scenario]
        if isinstance(case, str):
            pytest.skip(f"{self.name}: {case}")
        self.select(case)
        return case


# -- the subjects ----------------------------------------------------------------------------------


def chat(user: str, *, tools: list[dict[str, Any]] | None = TOOLS, **sampling: Any) -> GenerationRequest:
    return GenerationRequest(
        messages=[{"role": "user", "content": user}],
        tools=tools,
        sampling=SamplingParams(**{"temperature": 0, "max_tokens": 60, **sampling}),
    )


def template_ids(tokenizer: Any, request: GenerationRequest) -> list[int]:
    text = tokenizer.apply_chat_template(
        request.messages, tools=request.tools, add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(str(text), add_special_tokens=False)["input_ids"])


def script_cases(tokenizer: Any, *, malformed_text: str) -> dict[str, Case | str]:
    """The scenarios of SCRIPT (what the memorised model answers), shared by Scripted and Engine."""

    def case(request: GenerationRequest, text: str, finish: FinishReason, **kw: Any) -> Case:
        return Case(request, text, finish, template_ids(tokenizer, request), **kw)

    hi_ids = tokenizer("Hi there", add_special_tokens=False)["input_ids"]
    assert len(hi_ids) > LENGTH_LIMIT, "the length scenario needs a reply longer than its limit"
    call = [("calc", EXACT_ARGUMENTS)]
    return {
        "plain": case(chat("say hi"), "Hi there", "stop"),
        "tool_call": case(chat("add 2 and 3"), "", "tool_calls", tool_calls=call),
        "malformed": case(chat("break it"), malformed_text, "stop", malformed=True),
        "length": case(
            chat("say hi", max_tokens=LENGTH_LIMIT), tokenizer.decode(hi_ids[:LENGTH_LIMIT]), "length"
        ),
        "stop": case(chat("say hi", stop=["there"]), "Hi ", "stop"),
        "stream_tool": case(chat("two calls"), "ok", "tool_calls", tool_calls=call * 2),
    }


def scripted_subject(tokenizer: Any) -> Subject:
    replies: dict[str, ScriptedReply] = {
        "say hi": ScriptedReply(text="Hi there"),
        "add 2 and 3": ScriptedReply(tool_calls=[ScriptedToolCall(name="calc", arguments=EXACT_ARGUMENTS)]),
        "break it": ScriptedReply(malformed=True),
        "two calls": ScriptedReply(
            text="ok", tool_calls=[ScriptedToolCall(name="calc", arguments=EXACT_ARGUMENTS)] * 2
        ),
    }
    backend = ScriptedBackend(
        tokenizer,
        lambda request: replies[str((request.messages or [{}])[-1].get("content"))],
        model_name="scripted-policy",
        policy_version=3,
    )
    return Subject(
        "scripted",
        backend,
        "scripted-policy",
        3,
        script_cases(tokenizer, malformed_text=BROKEN_MARKUP),
        decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
    )


def engine_subject(tokenizer: Any, engine: Engine) -> Subject:
    return Subject(
        "engine",
        EngineBackend(engine, tokenizer, model_name="tiny-policy"),
        "tiny-policy",
        4,
        script_cases(tokenizer, malformed_text=SCRIPT["break it"]),
        decode=lambda ids: str(tokenizer.decode(ids, skip_special_tokens=True)),
    )


REPLAY_HAS_NO_MALFORMED = "the replay has no recording of a reply whose tool-call markup fails to parse"
REPLAY_STOP = (
    "stop strings are applied by the upstream server; a fixed recording cannot show one being honoured"
)


def vllm_subject(url: str, fake: FakeUpstream) -> Subject:
    chat_recording, tool_recording = fixture("vllm_chat.json"), fixture("vllm_chat_tool.json")
    completion = fixture("vllm_completion.json")["choices"][0]
    question = chat("What is 2+3?", tools=None, max_tokens=32)
    with_tools = chat("What is 2+3?", max_tokens=32)
    tool_call = tool_recording["choices"][0]["message"]["tool_calls"][0]["function"]

    def select(case: Case) -> None:
        fake.chat, fake.fail, fake.override = "vllm_chat.json", None, None

    return Subject(
        "upstream-vllm",
        UpstreamBackend(url + "/v1", QWEN, api_key="k", policy_version=2),
        QWEN,
        2,
        {
            "plain": Case(
                question,
                "2 + 3 = 5.",
                "stop",
                chat_recording["prompt_token_ids"],
                completion_ids=chat_recording["choices"][0]["token_ids"],
            ),
            "tool_call": Case(
                with_tools,
                "",
                "tool_calls",
                tool_recording["prompt_token_ids"],
                tool_calls=[(tool_call["name"], tool_call["arguments"])],
                completion_ids=tool_recording["choices"][0]["token_ids"],
            ),
            "malformed": REPLAY_HAS_NO_MALFORMED,
            "length": Case(
                GenerationRequest(prompt="The capital of France is", sampling=SamplingParams(max_tokens=9)),
                completion["text"],
                "length",
                completion["prompt_token_ids"],
                completion_ids=completion["token_ids"],
            ),
            "stop": REPLAY_STOP,
            "stream_tool": "the replayed vLLM stream is one recording, an answer without tool calls",
        },
        select=select,
    )


def sglang_subject(url: str, fake: FakeUpstream, tokenizer: Any) -> Subject:
    plain, tool = fixture("sglang_generate.json"), fixture("sglang_generate_tool.json")
    question = chat("What is 2+3?", tools=None, max_tokens=32)
    with_tools = chat("What is 2+3?", max_tokens=32)
    tool_case = Case(
        with_tools,
        "",
        "tool_calls",
        template_ids(tokenizer, with_tools),
        tool_calls=[("calc", '{"expression": "2+3"}')],  # as written in the recording's markup
        completion_ids=tool["output_ids"],
        recording="sglang_generate_tool.json",
    )

    def select(case: Case) -> None:
        fake.sglang, fake.fail, fake.override = case.recording or "sglang_generate.json", None, None

    return Subject(
        "upstream-sglang",
        # The server's meta_info.weight_version (3 in the recordings) wins over this default.
        UpstreamBackend(url, QWEN, flavor="sglang", tokenizer=tokenizer, policy_version=0),
        QWEN,
        3,
        {
            "plain": Case(
                question,
                plain["text"],
                "stop",
                template_ids(tokenizer, question),  # SGLang chat: the ids sent are the ids recorded
                completion_ids=[e[1] for e in plain["meta_info"]["output_token_logprobs"]],
                recording="sglang_generate.json",
            ),
            "tool_call": tool_case,
            "malformed": REPLAY_HAS_NO_MALFORMED,
            "length": "the replay has no SGLang recording cut by max_new_tokens",
            "stop": REPLAY_STOP,
            "stream_tool": tool_case,
        },
        select=select,
    )


@pytest.fixture(scope="module")
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    model, tokenizer = request.getfixturevalue("memorised")
    with Engine(model, tokenizer, max_batch_size=4, seed=0, policy_version=4) as running:
        yield running


@pytest.fixture(params=["scripted", "engine", "upstream-vllm", "upstream-sglang"])
def subject(request: pytest.FixtureRequest, tokenizer: Any) -> Subject:
    """Built lazily: only the engine subject trains the memorised model."""
    name = request.param
    if name == "scripted":
        return scripted_subject(tokenizer)
    if name == "engine":
        engine: Engine = request.getfixturevalue("engine")
        return engine_subject(engine.tokenizer, engine)
    fake, url = request.getfixturevalue("upstream")
    return vllm_subject(url, fake) if name == "upstream-vllm" else sglang_subject(url, fake, tokenizer)


# -- the contract ----------------------------------------------------------------------------------


def check(subject: Subject, case: Case, result: GenerationResult) -> None:
    """Every field of `result` against the contract and the values `case` expects."""
    ids, logprobs = result.completion_token_ids, result.logprobs
    assert result.text == case.text
    assert result.finish_reason in get_args(FinishReason)
    assert result.finish_reason == case.finish_reason
    assert result.prompt_token_ids == case.prompt_ids
    assert ids and all(isinstance(i, int) and i >= 0 for i in ids)
    if case.completion_ids is not None:
        assert ids == case.completion_ids
    assert len(logprobs) == len(ids), "one logprob per completion token"
    assert all(math.isfinite(lp) and lp <= 0.0 for lp in logprobs)
    limit = case.request.sampling.max_tokens
    if limit is not None:
        assert len(ids) <= limit
    if result.finish_reason == "length":
        assert len(ids) == limit
    assert [(c.name, c.arguments) for c in result.tool_calls] == case.tool_calls
    assert all(c.id for c in result.tool_calls)
    assert len({c.id for c in result.tool_calls}) == len(result.tool_calls), "tool call ids are unique"
    assert result.malformed_tool_call is case.malformed
    assert result.policy_version == subject.policy_version


async def collect_stream(backend: Backend, request: GenerationRequest) -> GenerationResult:
    """The stream's final result, after checking its shape: TextDeltas, then exactly one result whose
    text the deltas join to."""
    items = [item async for item in backend.stream(request)]
    *deltas, result = items
    assert isinstance(result, GenerationResult)
    assert all(isinstance(d, TextDelta) and d.text for d in deltas)
    assert "".join(d.text for d in deltas if isinstance(d, TextDelta)) == result.text
    return result


def test_backend_protocol_and_model_name(subject: Subject) -> None:
    assert isinstance(subject.backend, Backend)
    assert subject.backend.model_name == subject.model_name


async def test_plain_reply(subject: Subject) -> None:
    case = subject.case("plain")
    result = await subject.backend.generate(case.request)
    check(subject, case, result)
    assert result.tool_calls == [] and not result.malformed_tool_call
    if subject.decode is not None:
        assert subject.decode(result.completion_token_ids) == result.text


async def test_tool_call_keeps_the_exact_argument_text(subject: Subject) -> None:
    case = subject.case("tool_call")
    check(subject, case, await subject.backend.generate(case.request))


async def test_malformed_tool_markup_is_flagged_and_kept_as_text(subject: Subject) -> None:
    case = subject.case("malformed")
    result = await subject.backend.generate(case.request)
    check(subject, case, result)
    assert result.tool_calls == [] and "<tool_call>" in result.text


async def test_max_tokens_cuts_the_completion_with_length(subject: Subject) -> None:
    case = subject.case("length")
    result = await subject.backend.generate(case.request)
    check(subject, case, result)
    assert case.request.sampling.max_tokens is not None
    assert len(result.completion_token_ids) == case.request.sampling.max_tokens


async def test_stop_string_ends_the_text_before_it(subject: Subject) -> None:
    case = subject.case("stop")
    result = await subject.backend.generate(case.request)
    check(subject, case, result)
    assert not any(stop in result.text for stop in case.request.sampling.stop)


async def test_stream_deltas_join_to_the_result(subject: Subject) -> None:
    case = subject.case("plain")
    check(subject, case, await collect_stream(subject.backend, case.request))


async def test_stream_with_tool_calls_never_shows_markup(subject: Subject) -> None:
    case = subject.case("stream_tool")
    result = await collect_stream(subject.backend, case.request)
    check(subject, case, result)
    assert "<tool_call>" not in result.text
