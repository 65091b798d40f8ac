"""`reinforge store serve` and `reinforge store status`, as a user runs them."""

from __future__ import annotations

import asyncio
import json
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from reinforge.cli import app
from reinforge.store.http.client import HttpStoreClient
from reinforge.types import RolloutSpec

from .served import ServedStore

runner = CliRunner()


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedStore]:
    run_dir = tmp_path_factory.mktemp("run")
    store = ServedStore(run_dir)

    async def fill() -> None:
        async with HttpStoreClient(store.url, store.token) as client:
            await client.enqueue_rollouts([RolloutSpec(rollout_id=f"r{i}") for i in range(3)])
            await client.put_resources({"prompt": "hi"})

    asyncio.run(fill())
    yield store
    store.terminate()


def test_serve_writes_a_private_token_and_its_url(served: ServedStore) -> None:
    token_file = served.run_dir / "store.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert len(served.token) >= 43
    assert served.url.startswith("http://127.0.0.1:")
    assert (served.run_dir / "store.db").exists()  # SQLite in the run folder by default
    assert httpx.get(served.url + "/health").json() == {"status": "ok"}
    log = served.log.read_text()
    assert f"{served.url}/dashboard#token={served.token}" in log


def test_status_by_run_dir(served: ServedStore, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REINFORGE_STORE_TOKEN", raising=False)
    result = runner.invoke(app, ["store", "status", "--run-dir", str(served.run_dir)])
    assert result.exit_code == 0, result.output
    assert "rollouts queued" in result.output
    assert "3" in result.output
    assert "latest resources version" in result.output


def test_status_json_by_url_and_token(served: ServedStore) -> None:
    result = runner.invoke(app, ["store", "status", "--store", served.url, "--token", served.token, "--json"])
    assert result.exit_code == 0, result.output
    counters = json.loads(result.output)
    assert counters["rollouts_by_status"] == {"queued": 3}
    assert counters["resources_versions"] == 1
    assert counters["latest_resources_version"] == 0


def test_status_with_a_wrong_token_fails_clearly(served: ServedStore) -> None:
    result = runner.invoke(app, ["store", "status", "--store", served.url, "--token", "nope"])
    assert result.exit_code == 1
    assert "AuthenticationError" in result.output


def test_status_of_a_database_file(tmp_path: Path) -> None:
    db = tmp_path / "direct.db"
    result = runner.invoke(app, ["store", "status", "--store", f"sqlite:///{db}", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["spans"] == 0


def test_status_without_a_store_says_what_to_give(tmp_path: Path) -> None:
    result = runner.invoke(app, ["store", "status"])
    assert result.exit_code == 2
    assert "--store" in result.output
    result = runner.invoke(app, ["store", "status", "--run-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "store.url" in result.output


def test_status_of_an_unreachable_server(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = runner.invoke(app, ["store", "status", "--store", f"http://127.0.0.1:{port}", "--token", "t"])
    assert result.exit_code == 1
    assert "StoreUnavailableError" in result.output


def test_serve_refuses_a_busy_port(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        result = runner.invoke(app, ["store", "serve", "--run-dir", str(tmp_path), "--port", str(port)])
    assert result.exit_code == 2
    assert "--port" in result.output


def test_serve_uses_the_token_from_the_environment(tmp_path: Path) -> None:
    served = ServedStore(tmp_path, db="memory://", env={"REINFORGE_STORE_TOKEN": "env-token-123"})
    try:
        assert httpx.get(
            served.url + "/store/counters", headers={"Authorization": "Bearer env-token-123"}
        ).is_success
        assert not (tmp_path / "store.token").exists()  # nothing to write: the secret came from outside
        assert "token:     $REINFORGE_STORE_TOKEN" in served.log.read_text()
    finally:
        served.terminate()
