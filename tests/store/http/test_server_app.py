"""The app itself: OpenAPI bodies, mounting other apps, the dashboard's JSON calls, store ownership."""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI

from reinforge.net.background import BackgroundServer
from reinforge.store.http.server import create_store_app
from reinforge.store.memory import MemoryStore
from reinforge.types import RolloutSpec

from .conftest import TOKEN

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_openapi_declares_every_request_body(server: BackgroundServer) -> None:
    spec = httpx.get(server.url + "/openapi.json").json()
    posts = {path: item["post"] for path, item in spec["paths"].items() if "post" in item}
    assert len(posts) == 11
    for path, operation in posts.items():
        ref = operation["requestBody"]["content"]["application/json"]["schema"]["$ref"]
        name = ref.rsplit("/", 1)[1]
        assert name in spec["components"]["schemas"], (path, name)
    assert "Span" in spec["components"]["schemas"]
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_other_apps_mount_beside_the_store() -> None:
    gateway = FastAPI()

    @gateway.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    app = create_store_app(MemoryStore(), TOKEN)
    app.mount("/gateway", gateway)
    with BackgroundServer(app) as srv:
        assert httpx.get(srv.url + "/gateway/ping").json() == {"pong": "yes"}  # its own auth, not ours
        assert httpx.get(srv.url + "/store/counters").status_code == 401


async def test_the_dashboard_calls_routes_that_answer(server: BackgroundServer) -> None:
    """Every route the page's script calls answers on a plain store (tests/dashboard drive the page
    itself in a browser)."""
    script = httpx.get(server.url + "/dashboard/assets/app.js").text
    paths = set(re.findall(r'api\("(/[a-z]+)"', script))
    assert paths == {"/overview", "/metrics", "/rollouts", "/rollout", "/logprobs", "/runners"}
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
        await http.post("/store/rollouts/enqueue", json={"specs": [{"rollout_id": "d1"}]})
        params = {"/rollout": {"rollout_id": "d1"}, "/logprobs": {"rollout_id": "d1", "span_id": "0" * 16}}
        for path in paths:
            response = await http.get("/dashboard/api" + path, params=params.get(path))
            expected = 404 if path == "/logprobs" else 200  # d1 has no spans yet
            assert response.status_code == expected, (path, response.text)
    assert httpx.get(server.url + "/", follow_redirects=True).url.path == "/dashboard"


async def test_a_given_store_stays_open_after_the_server_stops() -> None:
    store = MemoryStore()
    with BackgroundServer(create_store_app(store, TOKEN)) as srv:
        assert httpx.post(
            srv.url + "/store/rollouts/enqueue", json={"specs": [{"rollout_id": "kept"}]}, headers=AUTH
        ).is_success
    assert (await store.get_rollout("kept")).rollout_id == "kept"
    await store.enqueue_rollouts([RolloutSpec(rollout_id="still-usable")])


@pytest.mark.parametrize("kwargs", [{"token": ""}, {"token": "t", "max_body_bytes": 0}])
def test_bad_app_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        create_store_app(MemoryStore(), **kwargs)  # type: ignore[arg-type]
