"""A real store server with the real gateway mounted beside it (scripted backend, real tokenizer),
and a recorder of every HTTP status the gateway answered."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from reinforge.gateway.app import create_gateway_app
from reinforge.inference.contract import GenerationRequest
from reinforge.inference.scripted import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore

GATEWAY_SECRET = "gateway-secret-" + "g" * 20
STORE_TOKEN = "store-token-" + "s" * 20
TASKS_ROOT = Path(__file__).resolve().parents[2] / "examples" / "harnesses" / "tasks"


class StatusRecorder:
    """ASGI middleware: every (method, path, status) the wrapped app answered."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.seen: list[tuple[str, str, int]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def recording_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                self.seen.append((scope["method"], scope["path"], message["status"]))
            await send(message)

        await self.app(scope, receive, recording_send)


@dataclass
class GatewayStack:
    store: MemoryStore
    backend: ScriptedBackend
    server: BackgroundServer
    statuses: StatusRecorder
    requests: list[GenerationRequest] = field(default_factory=list)

    @property
    def gateway_url(self) -> str:
        return self.server.url + "/gateway"


def serve(tokenizer: Any, replies: Any, **backend_options: Any) -> Iterator[GatewayStack]:
    store = MemoryStore()
    backend = ScriptedBackend(tokenizer, replies, **backend_options)
    app = create_store_app(store, STORE_TOKEN)
    statuses = StatusRecorder(create_gateway_app(store, backend, GATEWAY_SECRET))
    app.mount("/gateway", statuses)
    with BackgroundServer(app) as server:
        yield GatewayStack(store=store, backend=backend, server=server, statuses=statuses)


@pytest.fixture(scope="session")
def harness_tokenizer() -> Any:
    from reinforge.models import build_tokenizer

    corpus = [p.read_text() for p in TASKS_ROOT.rglob("*") if p.is_file()]
    corpus += ["THOUGHT: ```mswea_bash_command\necho COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT\n```"] * 5
    return build_tokenizer(corpus, vocab_size=400)
