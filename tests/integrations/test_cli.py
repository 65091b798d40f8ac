"""`reinforge runner --agent ...` turns the framework hooks on by default and
`--no-instrument-frameworks` turns them off, against a real HTTP store with the gateway beside it."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from reinforge import semconv
from reinforge.gateway.app import create_gateway_app
from reinforge.inference import ScriptedBackend
from reinforge.net.background import BackgroundServer
from reinforge.runner.cli import runner_command
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import RolloutSpec, SpanQuery

from .conftest import SECRET

STORE_TOKEN = "integration-store-token-" + "s" * 16


@pytest.fixture
def store_server(tokenizer: Any) -> Iterator[tuple[MemoryStore, str]]:
    store = MemoryStore()
    app = create_store_app(store, STORE_TOKEN)
    backend = ScriptedBackend(tokenizer, ["Draft: the answer is 42.", "Checked: the draft is correct."])
    app.mount("/gateway", create_gateway_app(store, backend, SECRET))
    with BackgroundServer(app) as server:
        yield store, server.url


def _roles_after_one_rollout(store: MemoryStore, url: str, *flags: str) -> list[str]:
    (rollout,) = asyncio.run(store.enqueue_rollouts([RolloutSpec(task={"question": "what is 6*7?"})]))
    app = typer.Typer()
    app.command()(runner_command)
    args = ["--store", url, "--store-token", STORE_TOKEN, "--gateway-secret", SECRET]
    args += ["--agent", "integrations.test_langgraph:writer_checker", "--max-rollouts", "1", *flags]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "succeeded 1, failed 0" in result.output
    spans = asyncio.run(store.query_spans(SpanQuery(rollout_id=rollout.rollout_id))).items
    roles = sorted(
        (s for s in spans if s.attributes.get(semconv.ATTR_STEP_KIND) == semconv.STEP_AGENT),
        key=lambda s: s.start_time,
    )
    return [s.attributes[semconv.ATTR_AGENT_NAME] for s in roles]


def test_the_cli_records_framework_roles_unless_told_not_to(store_server: tuple[MemoryStore, str]) -> None:
    store, url = store_server
    assert _roles_after_one_rollout(store, url) == ["writer", "checker"]
    assert _roles_after_one_rollout(store, url, "--no-instrument-frameworks") == []
