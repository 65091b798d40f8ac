"""A backend that forwards to an upstream inference server and reads back its exact token ids.

vLLM (flavor "vllm", >= 0.10.2): the OpenAI routes with `return_token_ids` (the response carries
`prompt_token_ids` and each choice's `token_ids`), `logprobs` and `return_tokens_as_token_ids` (each
logprob's `token` is `"token_id:<id>"`, the fallback when `token_ids` is absent). Older vLLM patched
the way agent-lightning does it (top-level `prompt_token_ids` and `response_token_ids`) works too.
vLLM's `prompt_logprobs` can't stand in: it drops the first prompt token's id.

SGLang (flavor "sglang"): the native `/generate` route with `return_logprob` (its
`meta_info.output_token_logprobs` holds `[logprob, token_id, text]` per token). Its OpenAI routes
don't return token ids, so chat prompts are rendered with the model's chat template here (pass
`tokenizer`) and sent as `input_ids`: the ids recorded are exactly the ids the server consumed.
Tool calls are parsed from the Hermes/Qwen markup in the text.

Token ids are only ever read from the server's answer (or are the ids we sent); if the server does
not return them the call fails with UpstreamError rather than re-tokenising text.

During training the trainer's weight sync (`reinforge.stack.weight_sync`) moves the backend to each new
policy version with `serve_version`, while the gateway holds calls: from then on every call names
that version (and, with LoRA, asks for that version's adapter) and every result carries it.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx

from reinforge import json_codec
from reinforge.errors import InvalidRequestError, UpstreamError
from reinforge.inference.chat_render import ChatRenderer
from reinforge.inference.contract import (
    FinishReason,
    GenerationRequest,
    GenerationResult,
    ResponseFormat,
    SamplingParams,
    TextDelta,
    ToolCall,
)
from reinforge.inference.tool_calls import TOOL_CALL_START, parse_tool_calls
from reinforge.net.keepalive_transport import DirectSender, KeepAliveTransport

Flavor = Literal["vllm", "sglang"]
_ROUTES = ("/v1/chat/completions", "/v1/completions", "/generate")
"""Every route the backend calls."""
_TOKEN_ID_PREFIX = "token_id:"


def _finish(reason: Any) -> FinishReason:
    if isinstance(reason, dict):  # SGLang: {"type": "stop", "matched": ...}
        reason = reason.get("type")
    if reason in ("stop", "length", "tool_calls"):
        return reason
    if reason == "abort":
        raise UpstreamError("the upstream server aborted the generation")
    return "stop"


def _ids_from_logprob_tokens(tokens: list[str]) -> list[int]:
    ids = []
    for token in tokens:
        if not token.startswith(_TOKEN_ID_PREFIX):
            raise UpstreamError(
                "the upstream returned logprob tokens as text, not token ids; vLLM needs "
                "return_tokens_as_token_ids (sent by reinforge) or return_token_ids (vLLM >= 0.10.2)"
            )
        ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
    return ids


_SAME_NAMED = ("stop", "stop_token_ids", "presence_penalty", "frequency_penalty")
"""Sampling fields vLLM and SGLang both name as reinforge does; sent only when set (else the
server's default applies)."""


def _sampling(s: SamplingParams, *, max_tokens: str, seed: str) -> dict[str, Any]:
    """The sampling fields vLLM and SGLang both take, the length cap and seed under the names given
    (the two servers differ only there; top-k and the rest are each caller's)."""
    out: dict[str, Any] = {"temperature": s.temperature, "top_p": s.top_p}
    for name in _SAME_NAMED:
        if value := getattr(s, name):
            out[name] = value
    if s.max_tokens is not None:
        out[max_tokens] = s.max_tokens
    if s.seed is not None:
        out[seed] = s.seed
    if s.logit_bias:
        out["logit_bias"] = {str(token): bias for token, bias in s.logit_bias.items()}
    return out


def _openai_response_format(fmt: ResponseFormat) -> dict[str, Any]:
    if fmt.type == "json_object":
        return {"type": "json_object"}
    return {"type": "json_schema", "json_schema": {"name": fmt.name or "response", "schema": fmt.json_schema}}


def _failure(url: str, exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return f"upstream {url} timed out ({type(exc).__name__})"
    return f"upstream {url} failed: {type(exc).__name__}: {exc}"


API_KEY_ENV = "REINFORGE_UPSTREAM_API_KEY"
"""Where the upstream server's API key is read from when none is given (never from argv)."""


def api_key_from_env() -> str | None:
    """`$REINFORGE_UPSTREAM_API_KEY`, or None when it is unset or empty."""
    return os.environ.get(API_KEY_ENV) or None


class UpstreamBackend:
    """Forward generations to vLLM or SGLang at `base_url` (the server root, e.g. http://h:8000)."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        *,
        flavor: Flavor = "vllm",
        tokenizer: Any = None,
        timeout_s: float = 600.0,
        policy_version: int = 0,
        max_connections: int = 1024,
    ) -> None:
        if flavor not in ("vllm", "sglang"):
            raise ValueError(f"flavor must be 'vllm' or 'sglang', not {flavor!r}")
        root = base_url.rstrip("/")
        self.base_url = root[: -len("/v1")] if root.endswith("/v1") else root
        self.model_name = model
        self.flavor: Flavor = flavor
        self.tokenizer = tokenizer
        self._renderer = ChatRenderer(tokenizer) if hasattr(tokenizer, "apply_chat_template") else None
        """Renders chat for SGLang's native API (token ids in, the policy's own turns kept as ids)."""
        self.policy_version = policy_version
        self.adapter: str | None = None
        """The LoRA adapter (its name on the server) that serves every call; None: the base model."""
        self._versions_managed = False
        """Set by `serve_version`: the trainer's sync decides the version, not the server's report."""
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
        # Absolute URLs built once: httpx then skips joining each call's path to the base URL.
        self._urls = {path: httpx.URL(self.base_url + path) for path in _ROUTES}
        # Every call, plain or streamed, goes straight to the transport. It keeps connections per
        # event loop: the gateway may be served from any thread.
        self._direct = DirectSender(
            KeepAliveTransport(max_connections=max_connections), self._headers, self._timeout
        )

    def serve_version(self, version: int, adapter: str | None = None) -> None:
        """Serve policy `version` from now on, through LoRA `adapter` (loaded on the server under that
        name) or the base model. Call it while no call is in flight (the gateway paused), so no
        answer mixes two versions."""
        self.policy_version = version
        self.adapter = adapter
        self._versions_managed = True

    async def aclose(self) -> None:
        await self._direct.transport.aclose()  # the transport stays usable: later calls reconnect

    def token_texts(self, ids: list[int]) -> list[str]:
        if self.tokenizer is not None:
            return [str(self.tokenizer.decode([i], skip_special_tokens=False)) for i in ids]
        return [_TOKEN_ID_PREFIX + str(i) for i in ids]

    # -- HTTP --------------------------------------------------------------------------------------

    async def _post(self, path: str, payload: dict[str, Any]) -> Any:
        try:
            response = await self._direct.send("POST", self._urls[path], json_codec.dumps(payload))
        except httpx.HTTPError as exc:
            raise UpstreamError(_failure(self.base_url + path, exc)) from None
        if response.status_code >= 400:
            self._raise_for(response.status_code, response.text, path)
        try:
            return json_codec.loads(response.content)
        except ValueError:
            raise UpstreamError(f"upstream {self.base_url}{path} answered with non-JSON") from None

    def _raise_for(self, status: int, text: str, path: str) -> None:
        message = text[:2000]
        try:
            data = json.loads(text)
            error = data.get("error", data) if isinstance(data, dict) else data
            if isinstance(error, dict):
                message = str(error.get("message") or error.get("detail") or error)
        except ValueError:
            pass
        if 400 <= status < 500 and status not in (401, 403, 404):
            # The request itself was refused (too long a prompt, a bad value): the agent's error.
            raise InvalidRequestError(f"the upstream server rejected the request: {message}")
        raise UpstreamError(f"upstream {self.base_url}{path} answered {status}: {message}")

    async def _stream_lines(self, path: str, payload: dict[str, Any]) -> AsyncIterator[str]:
        try:
            async with self._direct.stream("POST", self._urls[path], json_codec.dumps(payload)) as response:
                if response.status_code >= 400:
                    self._raise_for(
                        response.status_code, (await response.read()).decode(errors="replace"), path
                    )
                async for line in response.lines():
                    if line.startswith("data:"):
                        data = line[5:].strip()
                        if data == "[DONE]":
                            return
                        yield data
        except httpx.HTTPError as exc:
            raise UpstreamError(_failure(self.base_url + path, exc)) from None

    # -- requests ----------------------------------------------------------------------------------

    def _vllm_sampling(self, request: GenerationRequest) -> dict[str, Any]:
        s = request.sampling
        out = _sampling(s, max_tokens="max_tokens", seed="seed")
        if s.top_k:
            out["top_k"] = s.top_k
        if s.grammar is not None:
            out["structured_outputs"] = {"grammar": s.grammar}  # vLLM's field; llguidance reads it
        return out

    def _vllm_payload(self, request: GenerationRequest) -> tuple[str, dict[str, Any]]:
        payload: dict[str, Any] = {
            # vLLM serves a hot-loaded LoRA adapter under its own model name.
            "model": self.adapter or self.model_name,
            **self._vllm_sampling(request),
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if request.messages is not None:
            payload["messages"] = request.messages
            payload["logprobs"] = True
            if request.tools:
                payload["tools"] = request.tools
            if request.tool_choice is not None:
                payload["tool_choice"] = request.tool_choice
            if not request.parallel_tool_calls:
                payload["parallel_tool_calls"] = False
            if request.response_format is not None:
                payload["response_format"] = _openai_response_format(request.response_format)
            return "/v1/chat/completions", payload
        payload["prompt"] = request.prompt
        payload["logprobs"] = 0
        return "/v1/completions", payload

    def _sglang_payload(self, request: GenerationRequest) -> dict[str, Any]:
        s = request.sampling
        params = _sampling(s, max_tokens="max_new_tokens", seed="sampling_seed")
        params["top_k"] = s.top_k or -1
        if s.top_k and s.temperature > 0:
            raise InvalidRequestError(
                "SGLang reports logprobs renormalised over top-p but not top-k, so with top_k they are "
                "not the distribution sampled from and training would be off-policy; sample through "
                "SGLang with top_k 0 (top_p works)"
            )
        if s.grammar is not None:
            raise InvalidRequestError(
                "a Lark grammar can't be sent to SGLang's native API; use response_format"
            )
        if request.tool_choice not in (None, "auto", "none"):
            raise InvalidRequestError(
                f"tool_choice={request.tool_choice!r} is not supported through SGLang's native API"
            )
        if request.response_format is not None:
            fmt = request.response_format
            schema = fmt.json_schema if fmt.type == "json_schema" else {"type": "object"}
            params["json_schema"] = json.dumps(schema)
        payload: dict[str, Any] = {"sampling_params": params, "return_logprob": True}
        if self.adapter is not None:
            payload["lora_path"] = self.adapter  # SGLang names a loaded adapter in `lora_path`
        if request.messages is not None:
            if self._renderer is None:
                raise UpstreamError(
                    "chat through SGLang needs UpstreamBackend(tokenizer=...) with the model's chat template:"
                    " SGLang's OpenAI routes do not return token ids"
                )
            payload["input_ids"] = self._renderer.render(
                request.messages, request.tools, request.generated_turns
            )
        elif isinstance(request.prompt, list):
            payload["input_ids"] = request.prompt
        else:
            # Let the server tokenise, and read the ids it used back from the input logprobs.
            payload["text"] = request.prompt
            payload["logprob_start_len"] = 0
        return payload

    # -- responses ---------------------------------------------------------------------------------

    def _vllm_result(self, body: dict[str, Any], request: GenerationRequest) -> GenerationResult:
        try:
            choice = body["choices"][0]
        except (KeyError, IndexError, TypeError):
            raise UpstreamError("the upstream response has no choices") from None
        chat = request.messages is not None
        logprobs_block = choice.get("logprobs") or {}
        if chat:
            entries = logprobs_block.get("content") or []
            logprobs = [float(e["logprob"]) for e in entries]
            tokens = [e["token"] for e in entries]
            message = choice.get("message") or {}
            text = message.get("content") or ""
            tool_calls = [
                ToolCall(
                    id=c.get("id") or "",
                    name=c["function"]["name"],
                    arguments=c["function"].get("arguments", ""),
                )
                for c in message.get("tool_calls") or []
            ]
        else:
            logprobs = [float(x) for x in logprobs_block.get("token_logprobs") or []]
            tokens = list(logprobs_block.get("tokens") or [])
            text = choice.get("text") or ""
            tool_calls = []
        completion_ids = choice.get("token_ids")
        if completion_ids is None:
            patched = body.get("response_token_ids")  # agent-lightning's vLLM patch
            if patched and isinstance(patched[0], list):
                patched = patched[0]
            completion_ids = patched if patched is not None else _ids_from_logprob_tokens(tokens)
        prompt_ids = body.get("prompt_token_ids") or choice.get("prompt_token_ids")
        if prompt_ids is None and isinstance(request.prompt, list):
            prompt_ids = request.prompt
        if prompt_ids is None:
            raise UpstreamError(
                "the upstream response has no prompt token ids; vLLM >= 0.10.2 returns them for "
                "return_token_ids=true"
            )
        if len(logprobs) != len(completion_ids):
            raise UpstreamError(
                f"the upstream returned {len(completion_ids)} token ids but {len(logprobs)} logprobs"
            )
        return GenerationResult(
            text=text,
            prompt_token_ids=prompt_ids,  # validated into new lists
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            finish_reason=_finish(choice.get("finish_reason")),
            tool_calls=tool_calls,
            malformed_tool_call=bool(request.tools) and not tool_calls and TOOL_CALL_START in text,
            policy_version=self.policy_version,
        )

    def _sglang_result(
        self, body: Any, payload: dict[str, Any], request: GenerationRequest
    ) -> GenerationResult:
        if isinstance(body, list):
            body = body[0] if body else {}
        meta = body.get("meta_info") if isinstance(body, dict) else None
        if not isinstance(meta, dict) or "output_token_logprobs" not in meta:
            raise UpstreamError(
                "the SGLang response has no meta_info.output_token_logprobs (send return_logprob)"
            )
        entries = meta["output_token_logprobs"]
        completion_ids = [int(e[1]) for e in entries]
        logprobs = [float(e[0]) for e in entries]
        if "input_ids" in payload:
            prompt_ids = list(payload["input_ids"])
        else:
            prompt_ids = [int(e[1]) for e in meta.get("input_token_logprobs") or []]
            if not prompt_ids:
                raise UpstreamError(
                    "the SGLang response has no input_token_logprobs (send logprob_start_len=0)"
                )
        text = body.get("text") or ""
        tool_calls: list[ToolCall] = []
        malformed = False
        finish = _finish(meta.get("finish_reason"))
        if request.tools:
            parsed = parse_tool_calls(text)
            text, tool_calls, malformed = parsed.text, parsed.tool_calls, parsed.malformed
            if tool_calls and finish == "stop":
                finish = "tool_calls"
        version = meta.get("weight_version")
        policy_version = self.policy_version
        if not self._versions_managed and version is not None:
            with contextlib.suppress(TypeError, ValueError):
                policy_version = int(version)  # a frozen server's own numbering
        return GenerationResult(
            text=text,
            prompt_token_ids=prompt_ids,
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            finish_reason=finish,
            tool_calls=tool_calls,
            malformed_tool_call=malformed,
            policy_version=policy_version,
        )

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        if self.flavor == "sglang":
            payload = self._sglang_payload(request)
            return self._sglang_result(await self._post("/generate", payload), payload, request)
        path, payload = self._vllm_payload(request)
        return self._vllm_result(await self._post(path, payload), request)

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        if self.flavor == "sglang":
            # SGLang's native stream repeats cumulative state; one round-trip gives the same ids.
            result = await self.generate(request)
            if result.text:
                yield TextDelta(text=result.text)
            yield result
            return
        path, payload = self._vllm_payload(request)
        payload["stream"] = True
        chat = request.messages is not None
        prompt_ids: list[int] | None = None
        completion_ids: list[int] = []
        tokens: list[str] = []
        logprobs: list[float] = []
        texts: list[str] = []
        calls: dict[int, dict[str, str]] = {}
        finish: Any = None
        have_ids = False
        async for data in self._stream_lines(path, payload):
            chunk = json.loads(data)
            if "error" in chunk:
                raise UpstreamError(f"the upstream stream failed: {chunk['error']}")
            if chunk.get("prompt_token_ids") is not None:
                prompt_ids = chunk["prompt_token_ids"]
            for choice in chunk.get("choices") or []:
                if choice.get("prompt_token_ids") is not None:
                    prompt_ids = choice["prompt_token_ids"]
                if choice.get("token_ids") is not None:
                    have_ids = True
                    completion_ids.extend(choice["token_ids"])
                block = choice.get("logprobs") or {}
                if chat:
                    for entry in block.get("content") or []:
                        tokens.append(entry["token"])
                        logprobs.append(float(entry["logprob"]))
                    delta = choice.get("delta") or {}
                    piece = delta.get("content")
                    for call in delta.get("tool_calls") or []:
                        slot = calls.setdefault(
                            int(call.get("index", 0)), {"id": "", "name": "", "arguments": ""}
                        )
                        slot["id"] = call.get("id") or slot["id"]
                        fn = call.get("function") or {}
                        slot["name"] += fn.get("name") or ""
                        slot["arguments"] += fn.get("arguments") or ""
                else:
                    tokens.extend(block.get("tokens") or [])
                    logprobs.extend(float(x) for x in block.get("token_logprobs") or [])
                    piece = choice.get("text")
                if piece:
                    texts.append(piece)
                    yield TextDelta(text=piece)
                if choice.get("finish_reason") is not None:
                    finish = choice["finish_reason"]
        if prompt_ids is None and isinstance(request.prompt, list):
            prompt_ids = request.prompt
        if prompt_ids is None:
            raise UpstreamError("the upstream stream carried no prompt_token_ids (vLLM >= 0.10.2 needed)")
        if not have_ids:
            completion_ids = _ids_from_logprob_tokens(tokens)
        if len(completion_ids) != len(logprobs):
            raise UpstreamError(
                f"the upstream streamed {len(completion_ids)} token ids but {len(logprobs)} logprobs"
            )
        tool_calls = [
            ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for _, c in sorted(calls.items())
        ]
        text = "".join(texts)
        yield GenerationResult(
            text=text,
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=completion_ids,
            logprobs=logprobs,
            finish_reason=_finish(finish),
            tool_calls=tool_calls,
            malformed_tool_call=bool(request.tools) and not tool_calls and TOOL_CALL_START in text,
            policy_version=self.policy_version,
        )
