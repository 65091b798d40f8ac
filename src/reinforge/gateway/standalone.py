"""The gateway `reinforge store serve` mounts: its backend built from the command's options.

A served store carries a gateway even with no model behind it: runners finish attempts through it,
and command agents report rewards and send traces to it. Its LLM calls then answer 503 with what to
start the server with, instead of the 404 a missing route would give.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from reinforge.errors import InvalidRequestError, ReinforgeError
from reinforge.gateway.app import Gateway, create_gateway_app
from reinforge.inference.contract import (
    Backend,
    GenerationRequest,
    GenerationResult,
    TextDelta,
    token_id_texts,
)
from reinforge.store.gateway_mount import GatewayBackendOptions
from reinforge.store.protocol import Store
from reinforge.types import LeasedRollout


class NoModelError(ReinforgeError):
    """This gateway serves no model; its store server was started without a backend."""

    http_status = 503


class NoModelBackend:
    """Refuses every generation with a message naming the options that give the gateway a model."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name

    def _error(self) -> NoModelError:
        return NoModelError(
            "this store server serves no model: start `reinforge store serve` with --model-dir DIR, "
            "--upstream URL --upstream-model NAME, or --scripted FILE"
        )

    def token_texts(self, ids: list[int]) -> list[str]:
        return token_id_texts(ids)

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        raise self._error()

    async def stream(self, request: GenerationRequest) -> AsyncIterator[TextDelta | GenerationResult]:
        raise self._error()
        yield  # pragma: no cover  (makes this an async generator, as the contract has it)


def _scripted_backend(options: GatewayBackendOptions) -> Backend:
    from reinforge.inference.scripted import ScriptedBackend, ScriptedReply
    from reinforge.models import build_tokenizer

    assert options.scripted is not None
    try:
        replies = json.loads(options.scripted.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise InvalidRequestError(f"--scripted {options.scripted}: {e}") from e
    if not isinstance(replies, list) or not replies:
        raise InvalidRequestError(f"--scripted {options.scripted}: expected a non-empty JSON list of replies")
    try:
        parsed = [
            ScriptedReply(text=r) if isinstance(r, str) else ScriptedReply.model_validate(r) for r in replies
        ]
    except ValueError as e:
        raise InvalidRequestError(f"--scripted {options.scripted}: {e}") from e
    corpus = [json.dumps(r.model_dump()) for r in parsed] * 4
    tokenizer = build_tokenizer(corpus, vocab_size=400)
    return ScriptedBackend(tokenizer, parsed, model_name=options.model_name)


class StandaloneGateway:
    """The gateway app over `store`, with the backend `options` name (see `GatewayBackendOptions`)."""

    def __init__(self, store: Store, secret: str, options: GatewayBackendOptions) -> None:
        self.options = options
        self._engine: Any = None
        backend: Backend
        if options.model_dir is not None:
            backend = self._engine_backend(options)
        elif options.upstream is not None:
            from reinforge.inference.upstream import UpstreamBackend, api_key_from_env

            assert options.upstream_model is not None
            backend = UpstreamBackend(
                options.upstream,
                options.upstream_model,
                api_key_from_env(),
                flavor=options.upstream_flavor,
            )
        elif options.scripted is not None:
            backend = _scripted_backend(options)
        else:
            backend = NoModelBackend(options.model_name)
        self.backend = backend
        self.app = create_gateway_app(store, backend, secret)
        self.gateway: Gateway = self.app.state.gateway

    def _engine_backend(self, options: GatewayBackendOptions) -> Backend:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from reinforge.engine.engine import Engine
        from reinforge.engine.engine_backend import EngineBackend

        assert options.model_dir is not None
        if not (options.model_dir / "config.json").is_file():
            raise InvalidRequestError(f"--model-dir {options.model_dir} has no config.json (a model folder)")
        tokenizer = AutoTokenizer.from_pretrained(options.model_dir)
        model = AutoModelForCausalLM.from_pretrained(options.model_dir)
        model.eval()
        self._engine = Engine(
            model, tokenizer, max_batch_size=options.max_batch_size, max_seq_len=options.max_seq_len
        )
        return EngineBackend(self._engine, tokenizer, model_name=options.model_name)

    def leased(self, leased: list[LeasedRollout]) -> None:
        self.gateway.attempts.remember_running(lr.attempt for lr in leased)

    async def start(self) -> None:
        if self._engine is not None:
            await asyncio.to_thread(self._engine.start)

    async def close(self) -> None:
        await self.gateway.close()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.stop)
        aclose = getattr(self.backend, "aclose", None)
        if aclose is not None:
            await aclose()


def build_standalone_gateway(store: Store, secret: str, options: GatewayBackendOptions) -> StandaloneGateway:
    """The `GatewayBuilder` the `reinforge` command hands to `store serve`."""
    return StandaloneGateway(store, secret, options)
