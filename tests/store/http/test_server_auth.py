"""The bearer token: how it is made and kept, and that every store route demands it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import httpx
import pytest

from reinforge.errors import AuthenticationError
from reinforge.net.background import BackgroundServer
from reinforge.store.http.auth import (
    TOKEN_ENV,
    generate_token,
    load_or_create_token,
    read_token,
    resolve_client_token,
    token_path,
    tokens_match,
    write_token,
)
from reinforge.store.http.client import HttpStoreClient

from .conftest import TOKEN


def test_generated_tokens_are_long_and_distinct() -> None:
    tokens = {generate_token() for _ in range(50)}
    assert len(tokens) == 50
    assert all(len(t) >= 43 for t in tokens)


def test_token_file_is_owner_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    token = load_or_create_token(tmp_path / "run")
    path = token_path(tmp_path / "run")
    assert path.read_text() == token
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_restart_reuses_the_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    first = load_or_create_token(tmp_path)
    assert load_or_create_token(tmp_path) == first


def test_a_world_readable_token_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    first = load_or_create_token(tmp_path)
    os.chmod(token_path(tmp_path), 0o644)
    second = load_or_create_token(tmp_path)
    assert second != first
    assert stat.S_IMODE(token_path(tmp_path).stat().st_mode) == 0o600


def test_env_token_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_token(tmp_path, "from-file")
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert load_or_create_token(tmp_path) == "from-env"
    assert resolve_client_token(None, tmp_path) == "from-env"
    assert resolve_client_token("explicit", tmp_path) == "explicit"
    monkeypatch.delenv(TOKEN_ENV)
    assert resolve_client_token(None, tmp_path) == "from-file"
    assert read_token(tmp_path / "missing") is None


def test_tokens_match() -> None:
    assert tokens_match("abc", "abc")
    assert not tokens_match("abd", "abc")
    assert not tokens_match("", "abc")
    assert not tokens_match(None, "abc")
    assert not tokens_match("ab\u00e9", "abc")  # non-ASCII input is compared, not an exception


def _store_routes(server: BackgroundServer) -> list[tuple[str, str]]:
    spec = httpx.get(server.url + "/openapi.json").json()
    routes = []
    for path, item in spec["paths"].items():
        for method in item:
            if path.startswith("/store/"):
                concrete = (
                    path.replace("{rollout_id}", "r1").replace("{attempt_id}", "a1").replace("{version}", "0")
                )
                routes.append((method.upper(), concrete))
    return routes


@pytest.mark.parametrize(
    "header", [None, "Bearer wrong-token", "Basic " + TOKEN, f"Bearer {TOKEN}x", "Bearer"]
)
def test_every_store_route_needs_the_token(server: BackgroundServer, header: str | None) -> None:
    routes = _store_routes(server)
    assert len(routes) >= 16
    headers = {"Authorization": header} if header else {}
    with httpx.Client(base_url=server.url, headers=headers) as http:
        for method, path in routes:
            response = http.request(method, path, json={})
            assert response.status_code == 401, (method, path, response.text)
            assert response.json()["error"]["type"] == "AuthenticationError"
            assert "token" in response.json()["error"]["message"]
            assert response.headers["www-authenticate"] == "Bearer"


def test_health_and_dashboard_need_no_token(server: BackgroundServer) -> None:
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    page = httpx.get(server.url + "/dashboard")
    assert page.status_code == 200
    assert "reinforge store" in page.text
    assert TOKEN not in page.text


async def test_client_with_wrong_token_raises_authentication_error(server: BackgroundServer) -> None:
    client = HttpStoreClient(server.url, "wrong")
    with pytest.raises(AuthenticationError, match="wrong bearer token"):
        await client.counters()
    await client.close()


def test_client_without_any_token_says_where_to_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    with pytest.raises(AuthenticationError, match=r"store\.token"):
        HttpStoreClient("http://127.0.0.1:1")
