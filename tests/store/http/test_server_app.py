"""The app itself: OpenAPI bodies, mounting other apps, the dashboard's JSON calls, store ownership."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

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
    page = httpx.get(server.url + "/dashboard").text
    calls = re.findall(r'call\("(GET|POST)", "(/store/[a-z/]+)"', page)
    assert {path for _, path in calls} == {
        "/store/counters",
        "/store/resources/latest",
        "/store/rollouts/query",
    }
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
        await http.post("/store/rollouts/enqueue", json={"specs": [{"rollout_id": "d1"}]})
        await http.post("/store/resources", json={"resources": {"model": "tiny"}})
        for method, path in calls:
            response = await http.request(
                method, path, json={"limit": 25, "offset": 0} if method == "POST" else None
            )
            assert response.status_code == 200, (path, response.text)
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


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js to run the dashboard's script")
async def test_dashboard_script_renders_the_store(server: BackgroundServer, tmp_path: Path) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=AUTH) as http:
        await http.post(
            "/store/rollouts/enqueue", json={"specs": [{"rollout_id": f"d{i}"} for i in range(3)]}
        )
        leased = (await http.post("/store/rollouts/lease", json={"runner_id": "w"})).json()
        await http.post(
            f"/store/attempts/{leased[0]['attempt']['attempt_id']}/finish",
            json={"status": "succeeded", "reward": 0.5},
        )
        await http.post("/store/resources", json={"resources": {"model": "tiny"}})
    page = httpx.get(server.url + "/dashboard").text
    script = tmp_path / "dashboard.js"
    script.write_text(re.search(r"<script>(.*)</script>", page, re.S).group(1))  # type: ignore[union-attr]

    def render(fragment: str) -> dict[str, object]:
        shim = str(Path(__file__).with_name("dashboard_dom.js"))
        url = f"{server.url}/dashboard{fragment}"
        done = subprocess.run(["node", shim, str(script), url], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    shown = render(f"#token={TOKEN}")
    assert shown["error"] == ""
    assert shown["rollout-cards"] == [
        ["2", "queued"],
        ["0", "running"],
        ["1", "succeeded"],
        ["0", "failed"],
        ["0", "cancelled"],
    ]
    assert shown["latest"] == "0"
    assert shown["latest-resources"] == '{"model":"tiny"}'
    recent = shown["recent"]
    assert isinstance(recent, list)
    assert [row[0] for row in recent] == ["d2", "d1", "d0"]  # newest first
    assert recent[2][5] == "0.500"  # the reward column

    refused = render("#token=wrong")
    assert "refused the token" in str(refused["error"])
    assert refused["login_display"] == "block"
