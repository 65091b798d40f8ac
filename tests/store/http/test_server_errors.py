"""Bad input over raw HTTP: always a 4xx with the error envelope and a message that says why."""

from __future__ import annotations

import httpx
import pytest

from reinforge.net.background import BackgroundServer
from reinforge.types import MAX_PAGE_SIZE

from .conftest import TOKEN


def _assert_error(response: httpx.Response, status: int, type_name: str, *fragments: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["type"] == type_name
    for fragment in fragments:
        assert fragment in error["message"], error["message"]


async def test_malformed_json_is_400(http: httpx.AsyncClient) -> None:
    response = await http.post(
        "/store/rollouts/enqueue", content=b'{"specs": [', headers={"content-type": "application/json"}
    )
    _assert_error(response, 400, "InvalidRequestError", "malformed JSON")


async def test_wrong_types_are_422_naming_the_field(http: httpx.AsyncClient) -> None:
    response = await http.post("/store/rollouts/enqueue", json={"specs": [{"max_attempts": "many"}]})
    _assert_error(response, 422, "InvalidRequestError", "specs.0.max_attempts")
    response = await http.post("/store/rollouts/lease", json={"runner_id": "r", "max_rollouts": 0})
    _assert_error(response, 422, "InvalidRequestError", "max_rollouts")
    response = await http.post("/store/spans", json={"spans": [{"name": "x"}]})
    _assert_error(response, 422, "InvalidRequestError", "rollout_id")
    response = await http.post("/store/rollouts/enqueue", json={"specs": [], "surprise": 1})
    _assert_error(response, 422, "InvalidRequestError", "surprise")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/store/rollouts/query", {"offset": True}, "offset"),
        ("/store/spans/query", {"limit": True}, "limit"),
        ("/store/rollouts/enqueue", {"specs": [{"max_attempts": True}]}, "max_attempts"),
        ("/store/rollouts/lease", {"runner_id": "r", "max_rollouts": False}, "max_rollouts"),
        # Durations too (found by the schemathesis fuzz: `"lease_seconds": true` leased for 1 s).
        ("/store/rollouts/lease", {"runner_id": "r", "lease_seconds": True}, "lease_seconds"),
        ("/store/rollouts/lease", {"runner_id": "r", "wait_seconds": True}, "wait_seconds"),
        ("/store/rollouts/wait", {"rollout_ids": [], "timeout_seconds": False}, "timeout_seconds"),
    ],
)
async def test_booleans_are_not_numbers(
    http: httpx.AsyncClient, path: str, body: dict[str, object], field: str
) -> None:
    # pydantic's lax mode would read `true` as 1; a boolean count or offset is a client's bug.
    _assert_error(await http.post(path, json=body), 422, "InvalidRequestError", field)


async def test_out_of_range_values_are_refused(http: httpx.AsyncClient) -> None:
    response = await http.post("/store/rollouts/lease", json={"runner_id": "r", "lease_seconds": 1e300})
    _assert_error(response, 422, "InvalidRequestError", "lease_seconds")
    response = await http.post("/store/rollouts/lease", json={"runner_id": "r", "wait_seconds": 3600})
    _assert_error(response, 422, "InvalidRequestError", "wait_seconds")
    response = await http.get("/store/resources/-1")
    _assert_error(response, 422, "InvalidRequestError", "version")
    response = await http.get("/store/resources/not-a-number")
    _assert_error(response, 422, "InvalidRequestError", "version")


async def test_page_size_limit(http: httpx.AsyncClient) -> None:
    for path in ("/store/rollouts/query", "/store/attempts/query", "/store/spans/query"):
        response = await http.post(path, json={"limit": MAX_PAGE_SIZE + 1})
        _assert_error(response, 422, "InvalidRequestError", "limit")
        ok = await http.post(path, json={"limit": MAX_PAGE_SIZE})
        assert ok.status_code == 200
        assert ok.json() == {"items": [], "total": 0, "next_offset": None}


async def test_unknown_ids_are_404(http: httpx.AsyncClient) -> None:
    _assert_error(await http.get("/store/rollouts/nope"), 404, "NotFoundError", "nope")
    _assert_error(await http.get("/store/attempts/nope"), 404, "NotFoundError", "nope")
    _assert_error(await http.post("/store/attempts/nope/heartbeat", json={}), 404, "NotFoundError", "nope")
    finish = await http.post("/store/attempts/nope/finish", json={"status": "succeeded"})
    _assert_error(finish, 404, "NotFoundError", "nope")
    _assert_error(await http.get("/store/resources/latest"), 404, "NotFoundError")
    _assert_error(await http.get("/store/resources/7"), 404, "NotFoundError")
    _assert_error(await http.get("/store/no-such-route"), 404, "NotFoundError")


async def test_late_finish_is_409(http: httpx.AsyncClient) -> None:
    await http.post("/store/rollouts/enqueue", json={"specs": [{"rollout_id": "r1"}]})
    leased = (await http.post("/store/rollouts/lease", json={"runner_id": "w"})).json()
    attempt_id = leased[0]["attempt"]["attempt_id"]
    done = await http.post(f"/store/attempts/{attempt_id}/finish", json={"status": "succeeded", "reward": 1})
    assert done.status_code == 200
    assert done.json()["reward"] == 1.0
    again = await http.post(f"/store/attempts/{attempt_id}/finish", json={"status": "failed"})
    _assert_error(again, 409, "StaleAttemptError", attempt_id)
    assert (await http.get("/store/rollouts/r1")).json()["status"] == "succeeded"


async def test_resources_conflict_is_409(http: httpx.AsyncClient) -> None:
    first = await http.post("/store/resources", json={"resources": {"lr": 1}, "version": 3})
    assert first.status_code == 200
    assert first.json()["version"] == 3
    again = await http.post("/store/resources", json={"resources": {"lr": 1}, "version": 3})
    assert again.status_code == 200
    clash = await http.post("/store/resources", json={"resources": {"lr": 2}, "version": 3})
    _assert_error(clash, 409, "ConflictError")


async def test_wrong_method_is_405_with_envelope(http: httpx.AsyncClient) -> None:
    _assert_error(await http.delete("/store/counters"), 405, "InvalidRequestError")


async def test_non_json_content_type_is_a_client_error(http: httpx.AsyncClient) -> None:
    response = await http.post("/store/spans", content=b"spans", headers={"content-type": "text/plain"})
    assert 400 <= response.status_code < 500
    assert response.json()["error"]["type"] == "InvalidRequestError"


async def test_declared_oversize_body_is_413_before_reading(server: BackgroundServer) -> None:
    limit = 256 * 1024
    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        big = b'{"spans": [' + b" " * (limit + 10) + b"]}"
        response = await http.post("/store/spans", content=big, headers={"content-type": "application/json"})
        _assert_error(response, 413, "PayloadTooLargeError", str(limit))


async def test_streamed_oversize_body_is_413(server: BackgroundServer) -> None:
    async def chunks():  # type: ignore[no-untyped-def]
        yield b'{"spans": ['
        for _ in range(64):
            yield b" " * 8192
        yield b"]}"

    async with httpx.AsyncClient(base_url=server.url, headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        response = await http.post(
            "/store/spans", content=chunks(), headers={"content-type": "application/json"}
        )
        _assert_error(response, 413, "PayloadTooLargeError", "limit")


async def test_bad_content_length_is_400(server: BackgroundServer) -> None:
    import socket

    raw = (
        b"POST /store/spans HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + TOKEN.encode()
        + b"\r\nContent-Length: abc\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(raw)
        reply = sock.recv(4096)
    status = int(reply.split(b" ", 2)[1])
    assert 400 <= status < 500


@pytest.mark.parametrize("path", ["/openapi.json", "/docs"])
def test_openapi_is_served(server: BackgroundServer, path: str) -> None:
    assert httpx.get(server.url + path).status_code == 200
